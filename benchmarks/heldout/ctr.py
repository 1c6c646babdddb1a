"""Click-through prediction: dict batches, 26 embedding tables (a few of them large), a DLRM-style MLP.

What it is: the Criteo display-ads shape. A sample is a dict of 13 dense count features
(log-transformed in `__getitem__`, as the Criteo preprocessing does), 26 categorical ids and a
click label; the default collate stacks them into a dict batch. The model is DLRM's: a bottom
MLP for the dense features, one `nn.Embedding` per categorical feature (sizes from 3 to
100,000 rows, 300,000 in all, 16 wide: 4.9M parameters), the pairwise dot products of the 27
vectors, and a top MLP to one logit; binary cross-entropy, Adam. The embeddings' gradients are
dense (the default `sparse=False`), so every step Adam updates every row of every table. The
data are synthetic: categorical ids drawn with Zipf frequencies (a few values are most of the
traffic, as in Criteo), clicks from a hidden logistic model of a few features. Nothing is
downloaded.

Measured on AMD EPYC (AVX2, no AVX-512/AMX), 2 cores, with `autotune profile
benchmarks/heldout/ctr.py --windows 3` on a machine shared with other jobs (load average 4):
step median 74 ms, windows 910, 6988, 7068 samples/s, data 8%, forward 14%, backward 23%,
optimizer 55%; Bottleneck: `input` (a run at load 3 read `compute`, data 2%, optimizer 59%).
Adam's step is most of it: timed directly on the busy machine, it took 50-180 ms a step as
written, 40-240 ms with `foreach=True` and 5-25 ms with `fused=True`.

    autotune profile benchmarks/heldout/ctr.py
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import autotune

DENSE = 13
TABLES = (100_000, 60_000, 40_000, 30_000, 20_000, 15_000, 10_000, 8_000, 5_000, 4_000, 3_000, 2_000, 1_500,
          1_000, 800, 500, 300, 200, 100, 60, 30, 20, 12, 10, 5, 3)  # 26 tables, 301,540 rows


class ClickLog(torch.utils.data.Dataset):
    """Impressions: raw dense counts, categorical ids (already hashed into each table's range) and clicks."""

    def __init__(self, n: int, tables: tuple[int, ...] = TABLES, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.dense = rng.lognormal(1.0, 1.5, (n, DENSE)).astype(np.float32).round()
        self.dense[rng.random((n, DENSE)) < 0.2] = 0  # missing counts
        ranks = rng.zipf(1.2, (n, len(tables)))
        self.sparse = np.stack([(ranks[:, j] * 2654435761) % size for j, size in enumerate(tables)], 1).astype(np.int64)
        weights = rng.normal(0, 1, DENSE)
        logit = np.log1p(self.dense) @ weights * 0.3 + np.where(self.sparse[:, 0] % 7 == 0, 1.5, -0.5) - 1.5
        self.clicks = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)

    def __len__(self) -> int:
        return len(self.clicks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"dense": torch.log1p(torch.from_numpy(self.dense[i])),
                "sparse": torch.from_numpy(self.sparse[i]),
                "click": torch.tensor(self.clicks[i])}


def mlp(sizes: list[int], last_relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, tables: tuple[int, ...] = TABLES, dim: int = 16) -> None:
        super().__init__()
        self.bottom = mlp([DENSE, 64, 32, dim])
        self.embeddings = nn.ModuleList(nn.Embedding(size, dim) for size in tables)
        for e in self.embeddings:  # DLRM's initialisation
            bound = e.num_embeddings ** -0.5
            nn.init.uniform_(e.weight, -bound, bound)
        n = len(tables) + 1
        self.pairs = torch.triu_indices(n, n, offset=1)
        self.top = mlp([dim + n * (n - 1) // 2, 256, 128, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        vectors = torch.stack([x] + [e(sparse[:, j]) for j, e in enumerate(self.embeddings)], 1)  # [B, 27, dim]
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], 1)).squeeze(1)


def click_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(model(batch["dense"], batch["sparse"]), batch["click"])


def workload(n: int = 32_768, scale: float = 1.0, dim: int = 16, batch_size: int = 512) -> autotune.Workload:
    """`scale` shrinks every table (at least 4 rows each), for tests."""
    tables = tuple(max(4, int(size * scale)) for size in TABLES)
    return autotune.Workload(
        name="click-through (DLRM, dict batches, large embeddings)",
        model=lambda: DLRM(tables, dim),
        dataset=lambda: ClickLog(n, tables),
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-3),
        loss=click_loss,
        batch_size=batch_size,
    )
