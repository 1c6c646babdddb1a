"""Input-bound by I/O latency: every sample waits 2 ms, like a read from a slow disk or a
network object store. The model is a small MLP that needs far less than that per batch.

Planted bottleneck: `input`. The fix a performance engineer would choose: DataLoader
workers; since the wait is latency, not CPU, workers beyond the core count keep helping.

    autotune profile examples/input_bound.py
    autotune tune examples/input_bound.py --out runs/input
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import autotune
from _common import Synthetic, mlp


class SlowStore(Synthetic):
    """Each read waits `latency_s` before returning, as remote storage would."""

    def __init__(self, n: int, latency_s: float = 0.002) -> None:
        super().__init__(n, dim=128)
        self.latency_s = latency_s

    def __getitem__(self, i: int):
        time.sleep(self.latency_s)
        return super().__getitem__(i)


def workload(n: int = 4096, batch_size: int = 32) -> autotune.Workload:
    return autotune.Workload(
        name="input-bound (I/O latency)",
        model=lambda: mlp(128, 256, 2),
        dataset=lambda: SlowStore(n),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05),
        loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
        batch_size=batch_size,
    )


def small() -> autotune.Workload:
    """A smaller version for tests: same plant, fewer samples."""
    return workload(n=1024, batch_size=16)
