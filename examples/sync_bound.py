"""A training loop with an `.item()` every step: the loss function reads the loss back to
the host to skip "bad" batches, a common habit. On a GPU each read drains the launch
queue; on CPU it costs little, but it is still a sync point the diagnosis must name.

Planted bottleneck: `sync`. The fix is in the user's code (keep the check on device, e.g.
`torch.where`, or log every N steps), so autotune reports it rather than tuning it.

    autotune profile examples/sync_bound.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import autotune
from _common import Synthetic, mlp


def loss_with_item(model, batch):
    loss = F.cross_entropy(model(batch[0]), batch[1])
    if loss.item() > 1e4:  # host reads the value every step: a device-to-host sync
        loss = loss * 0
    return loss


def workload(batch_size: int = 128) -> autotune.Workload:
    return autotune.Workload(
        name="sync-bound (.item() every step)",
        model=lambda: mlp(256, 1024, 3),
        dataset=lambda: Synthetic(4096, dim=256),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05),
        loss=loss_with_item,
        batch_size=batch_size,
    )


def small() -> autotune.Workload:
    return workload(batch_size=64)
