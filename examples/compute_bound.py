"""Compute-bound: a wide MLP (width 2048) at batch 256, in-memory data. Nearly all of
the step is matrix multiplies; the loader has nothing to do.

Planted bottleneck: `compute`. Data-loader recipes cannot help; lower precision (bf16
autocast on CPUs with AMX or on GPUs) and compilation can.

    autotune profile examples/compute_bound.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import autotune
from _common import Synthetic, mlp


def workload(width: int = 2048, batch_size: int = 256) -> autotune.Workload:
    return autotune.Workload(
        name="compute-bound (wide MLP)",
        model=lambda: mlp(512, width, 3),
        dataset=lambda: Synthetic(8192, dim=512),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
        loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
        batch_size=batch_size,
    )


def small() -> autotune.Workload:
    return workload(width=1024, batch_size=128)
