"""Input-bound by CPU-heavy decoding: every sample runs about 2 ms of pure-Python work
(a toy codec: checksum-style arithmetic over bytes), like JPEG decoding or augmentation
written in Python.

Planted bottleneck: `input`. Workers help only up to the number of cores: past that they
compete for the same CPUs (and with the training process's threads).

    autotune profile examples/decode_bound.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import autotune
from _common import Synthetic, mlp


class Encoded(Synthetic):
    def __init__(self, n: int, work: int = 4000) -> None:
        super().__init__(n, dim=128)
        self.work = work

    def __getitem__(self, i: int):
        acc = i
        for k in range(self.work):  # the "decode": pure Python, holds the GIL, burns CPU
            acc = (acc * 1103515245 + k) & 0xFFFFFFFF
        x, y = super().__getitem__(i)
        return x + (acc % 7) * 1e-6, y


def workload(n: int = 4096, batch_size: int = 32) -> autotune.Workload:
    return autotune.Workload(
        name="input-bound (CPU decoding)",
        model=lambda: mlp(128, 256, 2),
        dataset=lambda: Encoded(n),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05),
        loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
        batch_size=batch_size,
    )


def small() -> autotune.Workload:
    return workload(n=1024, batch_size=16)
