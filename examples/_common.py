"""Small pieces the examples share: a synthetic classification set and an MLP."""

from __future__ import annotations

import torch
from torch import nn


class Synthetic(torch.utils.data.Dataset):
    """`n` fixed random feature vectors with labels, generated once from a seed.

    Samples are kept as a list of tensors and Python ints: indexing a list is about four
    times cheaper than indexing one big tensor per sample, so in-memory data stays cheap.
    """

    def __init__(self, n: int, dim: int, classes: int = 10, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = list(torch.randn(n, dim, generator=g).unbind(0))
        self.y = torch.randint(0, classes, (n,), generator=g).tolist()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def mlp(dim: int, hidden: int, depth: int, classes: int = 10) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(dim, hidden), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, classes))
