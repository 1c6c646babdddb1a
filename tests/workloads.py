"""Tiny workloads the tests share (module level, so DataLoader workers and worker processes
can import them). A target file written by a test can `from workloads import *`; see the
`tiny_target` fixture in conftest.py."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import autotune


class Vectors(torch.utils.data.Dataset):
    """`n` fixed random vectors with class labels (module level, so workers can use it)."""

    def __init__(self, n: int = 64, dim: int = 8, classes: int = 3, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Images(torch.utils.data.Dataset):
    def __init__(self, n: int = 32, seed: int = 2) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, 8, 8, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Empty(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(())


class Stream(torch.utils.data.IterableDataset):
    """`n` fixed vectors read in order, like a file (`split`: each loader worker reads
    every `num_workers`-th of them, as `get_worker_info` allows; else each reads them all);
    `latency_s` per sample, like a remote store."""

    def __init__(self, n: int = 64, split: bool = False, latency_s: float = 0.0) -> None:
        self.data, self.split, self.latency_s = Vectors(n), split, latency_s

    def __iter__(self):
        import time

        info = torch.utils.data.get_worker_info()
        start, step = (info.id, info.num_workers) if self.split and info is not None else (0, 1)
        for i in range(start, len(self.data), step):
            if self.latency_s:
                time.sleep(self.latency_s)
            yield self.data[i]


class Block(nn.Module):
    """A residual MLP block that counts how often its forward runs."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x + torch.tanh(self.fc(x))


class NormBlock(nn.Module):
    """A residual block with BatchNorm: running statistics a forward updates."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc, self.norm = nn.Linear(dim, dim), nn.BatchNorm1d(dim)

    def forward(self, x):
        return x + torch.relu(self.norm(self.fc(x)))


def norm_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), NormBlock(16), NormBlock(16), nn.Linear(16, 3))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def blocks_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), Block(16), Block(16), nn.Linear(16, 3))


def convnet() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 4))


def ce_loss(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def make(**kw) -> autotune.Workload:
    base = dict(
        name="tiny",
        model=mlp,
        dataset=lambda: Vectors(64),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        loss=ce_loss,
        batch_size=16,
    )
    base.update(kw)
    return autotune.Workload(**base)


TARGET_HEADER = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import torch
import torch.nn.functional as F
from torch import nn

import autotune
from workloads import *  # Vectors, Images, Empty, Stream, Block, mlp, convnet, ce_loss, make, ...
"""


def write_target(folder: Path, name: str, body: str) -> Path:
    """A target file in `folder` whose body can use these workloads (`make(...)`)."""
    path = Path(folder) / name
    path.write_text(TARGET_HEADER + "\n\n" + textwrap.dedent(body))
    return path


def check_finite(losses: list[float]) -> bool:
    return all(math.isfinite(x) for x in losses)
