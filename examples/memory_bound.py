"""Memory-bound: a deep residual MLP whose saved activations dominate memory. At batch 256
and width 512 with 16 blocks, the step needs far more than the parameters: run it with a
limit it exceeds.

Planted bottleneck: `memory` (given `--memory-limit`). The fixes: activation checkpointing
of the blocks (recompute in backward) or micro-batches with gradient accumulation.

    autotune profile examples/memory_bound.py --memory-limit 64MB
    autotune tune examples/memory_bound.py --memory-limit 64MB
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import autotune
from _common import Synthetic


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))


class Deep(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(64, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.out = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))


def workload(width: int = 512, depth: int = 16, batch_size: int = 256) -> autotune.Workload:
    return autotune.Workload(
        name="memory-bound (deep residual MLP)",
        model=lambda: Deep(width, depth),
        dataset=lambda: Synthetic(4096, dim=64),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
        loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
        batch_size=batch_size,
        checkpoint_blocks=(Block,),
    )


def small() -> autotune.Workload:
    return workload(width=384, depth=8, batch_size=128)
