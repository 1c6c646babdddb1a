"""Helpers over a batch of any structure (tensor, tuple, list, dict): move, split, count."""

from __future__ import annotations

from typing import Any

import torch


def map_tensors(batch: Any, fn) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [map_tensors(v, fn) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


def to_device(batch: Any, device: torch.device, non_blocking: bool, channels_last: bool) -> Any:
    def move(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device, non_blocking=non_blocking)
        if channels_last and t.dim() == 4 and t.is_floating_point():
            t = t.contiguous(memory_format=torch.channels_last)
        return t

    return map_tensors(batch, move)


def split(batch: Any, parts: int) -> list[Any]:
    """Split every tensor along dim 0 into `parts` equal chunks; other leaves are repeated."""
    if parts == 1:
        return [batch]
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(parts, dim=0))
    if isinstance(batch, dict):
        chunks = {k: split(v, parts) for k, v in batch.items()}
        return [{k: chunks[k][i] for k in batch} for i in range(parts)]
    if isinstance(batch, (list, tuple)):
        cols = [split(v, parts) for v in batch]
        make = (lambda xs: type(batch)(*xs)) if hasattr(batch, "_fields") else type(batch)
        return [make([c[i] for c in cols]) for i in range(parts)]
    return [batch] * parts
