"""Whether a workload's loss averages its batch's samples or sums them.

Micro-batching divides each micro-batch's loss by the number of micro-steps, so that the
accumulated gradient is the whole batch's: right for a loss that averages its samples
(`reduction="mean"`, the default almost everywhere), and N times too small for one that
sums them (`reduction="sum"`, common in VAEs and some sequence losses): the tuned run would
train at a learning rate N times lower than the untuned one, and no throughput figure says
so. One look tells them apart exactly: a batch's loss is the size-weighted mean of its two
halves' losses for an average, their sum for a sum. The look runs once per trainer, without
grad, in eval mode (no dropout, no batch statistics) on the first micro-batch, and leaves
the model's modes and the random streams as they were.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from . import batch as batching

__all__ = ["sums_over_samples"]


def sums_over_samples(model: torch.nn.Module, loss: Callable[[torch.nn.Module, Any], torch.Tensor], batch: Any,
                      parts: int, autocast: Any) -> bool:
    """Whether `loss(model, batch)` sums over the samples of `batch` (split in `parts`
    micro-batches); False where it averages them, or where the look cannot say."""
    rows = _rows(batch)
    if parts < 2 or rows is None or rows < 2:
        return False
    first = batching.split(batch, parts if rows // parts >= 2 else max(1, parts // 2))[0]  # at least 2 samples
    halves = batching.split(first, 2)
    sizes = [_rows(h) for h in halves]
    if len(halves) != 2 or None in sizes or min(sizes) < 1:
        return False
    modes = {m: m.training for m in model.modules()}
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad(), autocast:
            model.eval()
            whole, a, b = (float(loss(model, x)) for x in (first, *halves))
    except Exception:  # noqa: BLE001 - a loss that cannot run like this: the trials' own steps say why
        return False
    finally:
        for m, training in modes.items():
            m.training = training
    if not all(math.isfinite(v) for v in (whole, a, b)):
        return False
    mean = (sizes[0] * a + sizes[1] * b) / (sizes[0] + sizes[1])
    return abs(whole - (a + b)) < abs(whole - mean)


def _rows(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor."""
    found: list[int] = []
    batching.map_tensors(batch, lambda t: found.append(t.shape[0] if t.dim() else 0) or t)
    return found[0] if found else None
