"""Overhead-bound (launch-bound): 48 tiny layers of width 32 at batch 16. Every op is a
few microseconds of math behind a few microseconds of Python and dispatcher overhead.

Planted bottleneck: `launch` (on CPU: framework overhead). The fixes: fewer, fused ops
(torch.compile), a fused/foreach optimizer step over the many small parameters.

    autotune profile examples/overhead_bound.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import autotune
from _common import Synthetic, mlp


def workload(depth: int = 48, batch_size: int = 16) -> autotune.Workload:
    return autotune.Workload(
        name="overhead-bound (tiny layers)",
        model=lambda: mlp(32, 32, depth),
        dataset=lambda: Synthetic(4096, dim=32),
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-3),
        loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
        batch_size=batch_size,
    )


def small() -> autotune.Workload:
    return workload(depth=32)
