"""What handing one batch from a loader worker to the training process costs here: the
floor under any data wait that workers leave.

A worker loads a batch in its own process, but the training process still receives it:
the queue, unpickling, mapping the tensors' shared memory. That costs about a millisecond
per batch whatever the batch holds, so loading that takes less per batch in the step cannot
be shortened by workers. The workload's own batches, through a
one-worker loader like the trainer's, each read after a pause long enough for the worker
to have it ready: the least of those reads is the hand-off alone (a burst elsewhere only
adds). It takes a second or two, once per run.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from .config import TrainConfig
from .diagnose import amdahl, resolvable
from .record import Bottleneck, Summary, Verdict, Waste
from .workload import Workload

__all__ = ["READS", "batch_handoff_s", "gates", "loader_bound", "step_share", "why_not"]

READS = 12  # batches read after a pause; the least is the hand-off
LOADS = 3  # batches loaded in this process first: how long the worker needs for one
BUDGET_S = 3.0  # at most this long in all after the worker's start (at least `LEAST` reads)
LEAST = 3
PAUSE_FLOOR_S = 0.002  # the worker's own wake-up and queue put


def batch_handoff_s(workload: Workload, seed: int = 0) -> float | None:
    """The least time the training process spends receiving one ready batch from a loader
    worker (s), for `workload`'s own batches; None where it cannot be read (a dataset that
    fails, an empty one)."""
    try:
        dataset = workload.make_dataset()
        load = _load_s(_loader(workload, dataset, 0, seed))
        if load is None:
            return None
        loader = _loader(workload, dataset, 1, seed)
        it = iter(loader)
        try:
            next(it)  # the worker's start and its first batch
            reads: list[float] = []
            pause, start = max(PAUSE_FLOOR_S, 2 * load), time.perf_counter()
            while len(reads) < READS and (len(reads) < LEAST or time.perf_counter() - start < BUDGET_S):
                time.sleep(pause)
                t0 = time.perf_counter()
                next(it)
                reads.append(time.perf_counter() - t0)
        finally:
            del it
        return min(reads) if reads else None
    except Exception:  # noqa: BLE001 - a probe that cannot read says nothing; the trials will say why
        return None


def _loader(workload: Workload, dataset: Any, workers: int, seed: int) -> DataLoader:
    sampler = None if isinstance(dataset, IterableDataset) else \
        RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    kw: dict[str, Any] = {"num_workers": workers, "timeout": 60} if workers else {}
    return DataLoader(dataset, batch_size=workload.rank_batch, sampler=sampler, drop_last=True,
                      collate_fn=workload.collate_fn, **kw)


def _load_s(loader: DataLoader) -> float | None:
    """The median time to load one batch in this process (after the first)."""
    it, times = iter(loader), []
    try:
        next(it)
        for _ in range(LOADS):
            t0 = time.perf_counter()
            next(it)
            times.append(time.perf_counter() - t0)
    except StopIteration:
        pass
    return statistics.median(times) if times else None


def step_share(handoff_s: float | None, config: TrainConfig, summary: Summary) -> float | None:
    """The share of `summary`'s step that receiving its batch (one per step: micro-batches
    are split from it) from a worker would cost, where the step loads it in its own process
    (else None: workers already pay it)."""
    step_s = summary.step_time_s.mean
    if handoff_s is None or config.data.num_workers or not step_s or step_s <= 0:
        return None
    return handoff_s / step_s


def loader_bound(waste: Waste, share: float) -> float:
    """The most loader workers can gain on an input waste where receiving each batch from
    them costs `share` of the step (Amdahl on the wait beyond it)."""
    return amdahl(max(0.0, waste.share - share))


def gates(waste: Waste, share: float | None, margin: float) -> bool:
    """Whether loader workers are not worth trials on `waste`: an input wait whose part
    beyond the hand-off (`share` of the step; None: not measured, or the step already
    receives its batches from workers) could not gain what the noise can resolve."""
    return share is not None and waste.cls is Bottleneck.INPUT and loader_bound(waste, share) <= resolvable(margin)


def why_not(handoff_s: float | None, summary: Summary, verdict: Verdict, share: float | None, margin: float) -> str:
    """Why workers cannot shorten the step's input wait enough to be worth trials, where
    receiving a batch from one costs `share` of the step (`handoff_s`); "" where they can,
    or it was not measured."""
    data = summary.stages.get("data")
    waste = next((w for w in verdict.wastes if w.cls is Bottleneck.INPUT), None)
    if handoff_s is None or data is None or waste is None or not gates(waste, share, margin):
        return ""
    if data.share <= share:
        return (f"handing a batch over from a loader worker costs {handoff_s * 1e3:.2f} ms here, more than the "
                f"{data.s * 1e3:.2f} ms the step spends loading one: workers cannot shorten the wait")
    return (f"handing a batch over from a loader worker costs {handoff_s * 1e3:.2f} ms here of the "
            f"{data.s * 1e3:.2f} ms the step spends loading one: workers could gain at most "
            f"{loader_bound(waste, share):.3f}x, within what the noise can resolve")
