"""Two CPU processes training with DistributedDataParallel over gloo: a model with large
gradients and little compute, so the step is dominated by the gradient all-reduce.

Four wide Linear layers (1024 x 1024: about 4.2 M parameters, 16 MB of fp32 gradients
all-reduced every step) on a global batch of 16 samples (8 per rank): each rank computes
for tens of milliseconds and then sends and receives 16 MB through the loopback interface.

Planted bottleneck: `communication`. autotune measures it against a no-all-reduce
reference (see `autotune.comm`) and tries the `ddp` recipe (bucket size,
gradient_as_bucket_view, static_graph). Those knobs only reschedule the same bytes; what a
good engineer would do when the all-reduce dominates is send fewer bytes per sample:

- all-reduce less often: a larger global batch (or accumulation under `no_sync()` over
  more samples per optimizer step), if the optimisation tolerates it;
- all-reduce smaller gradients: a compression hook
  (`model.register_comm_hook(None, torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook)`)
  halves the bytes, at some precision cost;
- fewer parameters to synchronise (tie or factorise the wide layers), or, on one machine
  with few cores as here, no DDP at all: one process with all the cores sends nothing.

    autotune profile examples/ddp_comm_bound.py
    autotune tune examples/ddp_comm_bound.py --out runs/ddp --budget 4m
    autotune train examples/ddp_comm_bound.py --config runs/ddp/tuned.yaml --steps 50
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import autotune
from _common import Synthetic

WIDTH = 1024


def model() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10))


def workload(batch_size: int = 16, world_size: int = 2) -> autotune.Workload:
    return autotune.Workload(
        name="ddp-comm-bound (2 ranks, 16 MB of gradients)",
        model=model,
        dataset=lambda: Synthetic(1024, dim=WIDTH),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
        loss=lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]),
        batch_size=batch_size,
        world_size=world_size,
    )
