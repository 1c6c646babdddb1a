"""Whether loader workers would each yield the whole of an iterable dataset.

A map-style dataset is split between workers by the sampler. An `IterableDataset` splits
itself or not at all: one that iterates its source without asking
`torch.utils.data.get_worker_info()` yields the same samples in every worker, so N workers
train on each sample N times per epoch. Its throughput in samples/s rises with N all the
same, and a search would keep the duplication as a speed-up. Two workers' first batches
tell the common case (a deterministic stream: a file, a list, a table scan) at the cost of
starting two workers; a stream that differs per worker by chance (each worker's seed) is
not told apart, and neither is a dataset that fails in a worker (the trials say why).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, IterableDataset

__all__ = ["repeats_in_workers"]


def repeats_in_workers(dataset: Any, batch_size: int, collate_fn: Callable | None = None) -> bool:
    """Whether `dataset` is an iterable dataset whose first batch is the same in two loader
    workers (each would yield it all); False for a map-style dataset or where unreadable."""
    if not isinstance(dataset, IterableDataset):
        return False
    try:
        it = iter(DataLoader(dataset, batch_size=batch_size, num_workers=2, collate_fn=collate_fn))
        try:
            first, second = next(it), next(it)  # batch i comes from worker i % 2
        finally:
            del it
    except Exception:  # noqa: BLE001 - too short, or failing in a worker: nothing to tell here
        return False
    return same(first, second)


def same(a: Any, b: Any) -> bool:
    """Two batches hold equal values (tensors, mappings and sequences of them, scalars)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, Sequence) and not isinstance(a, (str, bytes)):
        return isinstance(b, Sequence) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that do not compare: not shown to be the same
        return False
