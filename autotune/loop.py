"""The training loop: applies every `TrainConfig` knob for real, on CPU and CUDA.

This is the code path that is measured and the one `autotune train` runs in production.
A config never changes the effective batch or the data seen: the DataLoader always yields
the global batch in the same seeded order, and gradient accumulation splits it on device.
Stage boundaries are reported to a clock (`mark(stage)`) that adds no synchronisation.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader

from . import apply, ranks, reduction
from .config import TrainConfig
from .errors import ConfigError, UserError, call_user
from .workload import Workload, has_conv



_NULL = contextlib.nullcontext()


@contextlib.contextmanager
def _workers_past_cores_allowed() -> Iterator[None]:
    """More workers than cores is a knob autotune measures on purpose, not a mistake to
    warn about; the filter holds only while the loader is built or an epoch starts."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        yield


class NullClock:
    """A clock that times nothing: production training."""

    def mark(self, stage: str) -> None:  # noqa: D401 - trivial member of the clock family
        return None


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was given but CUDA is not available on this machine; use --device cpu or auto.")
    if name not in ("cpu", "cuda"):
        raise UserError(f"--device {name!r} is not known; use auto, cpu or cuda.")
    return torch.device(name)


def check_applicable(workload: Workload, config: TrainConfig, device: torch.device) -> None:
    """Rules that need the workload or the device; every error at once, as a `ConfigError`."""
    errors = []
    cuda = device.type == "cuda"
    mb = config.memory.micro_batch_size
    if mb is not None and (mb > workload.batch_size or workload.batch_size % mb):
        errors.append(
            f"memory.micro_batch_size {mb} does not divide the global batch {workload.batch_size}; "
            "use a divisor of it or null"
        )
    for key in ("data.pin_memory", "precision.tf32", "backend.cudnn_benchmark"):
        if config.get(key) and not cuda:
            errors.append(f"{key} needs CUDA, but the device is {device.type}; set it to false")
    if config.memory.activation_checkpointing and not workload.checkpoint_blocks:
        errors.append(
            "memory.activation_checkpointing needs Workload.checkpoint_blocks (the module types to wrap); "
            "add them to the workload or set it to false"
        )
    if config.precision.amp == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        errors.append("precision.amp bf16 is not supported by this GPU; use fp16 or none")
    world, declared = config.distributed.world_size, workload.world_size
    if world != declared:
        errors.append(f"distributed.world_size {world} differs from the workload's world_size {declared}: the "
                      "world size comes from the workload (Workload(world_size=...) or --world-size); use a config "
                      "for that world size")
    elif world > 1 and mb is not None and workload.rank_batch % mb:
        errors.append(f"memory.micro_batch_size {mb} does not divide the per-rank batch {workload.rank_batch} "
                      f"(global batch {workload.batch_size} over {world} ranks); use a divisor of it or null")
    elif world > 1 and mb is not None and mb < workload.rank_batch and config.distributed.static_graph:
        # DDP records a static graph in its first step; one starting under no_sync() fails an
        # internal assert in the reducer (measured with torch 2.13 on gloo).
        errors.append("distributed.static_graph cannot be combined with micro-batches (memory.micro_batch_size "
                      f"{mb} < per-rank batch {workload.rank_batch}: accumulation under no_sync()); "
                      "set one of them back")
    if config.compile.mode != "none" and os.name == "nt":
        errors.append("compile.mode needs a platform torch.compile supports; use none")
    if errors:
        raise ConfigError(errors, f"config for workload {workload.name!r} on {device.type}")


class Trainer:
    """A model, optimizer and data loader built from a workload and a config, ready to step."""

    def __init__(self, workload: Workload, config: TrainConfig, device: torch.device, seed: int = 0,
                 rank: ranks.RankSpec | None = None) -> None:
        workload.check()
        check_applicable(workload, config, device)
        self.rank = rank
        if config.distributed.world_size > 1:  # first: a failure below must not leave other ranks at the rendezvous
            if rank is None:
                raise UserError(f"Workload {workload.name!r} has world_size {workload.world_size}: its ranks are "
                                "started by autotune (profile, tune, train); build a Trainer with a RankSpec")
            device = ranks.device_of(device, rank)
            ranks.init_group(rank, device)
        self.workload, self.config, self.device, self.seed = workload, config, device, seed
        self.rank_batch = workload.rank_batch  # samples this rank draws per optimizer step
        self.threads = apply.apply_backend(config, device)
        torch.manual_seed(seed)
        model = call_user("the workload's model factory", workload.model)
        if not isinstance(model, torch.nn.Module):
            raise UserError(f"Workload {workload.name!r}: model() returned {type(model).__name__}, not a torch.nn.Module.")
        self.has_conv = has_conv(model)
        model, self.step_model = apply.prepare_model(model.to(device), config, workload.checkpoint_blocks)
        model.train()
        optimizer = call_user("the workload's optimizer factory", workload.optimizer, model.parameters())
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise UserError(
                f"Workload {workload.name!r}: optimizer(params) returned {type(optimizer).__name__}, not a "
                "torch.optim.Optimizer; return one built on the parameters it is given "
                "(e.g. lambda params: torch.optim.SGD(params, lr=0.1))."
            )
        self.optimizer = apply.set_optimizer_impl(optimizer, config, f"config for workload {workload.name!r}")
        self.model = model
        self.scaler = apply.grad_scaler(config, device)
        self.accum = apply.accumulation_steps(config, self.rank_batch)
        self.loss_sums: bool | None = None  # the loss sums its samples: not divided per micro-step (`reduction`)
        self._autocast = apply.autocast(config, device)  # reusable: entered once per micro-step
        self._to_device = device.type != "cpu" or config.layout.channels_last
        self.dataset = workload.make_dataset()
        self.loader = self._make_loader()
        self._epoch_iter = None  # the loader iterator of the epoch in progress
        self.steps_done = 0
        self.annotate = False  # named profiler ranges per stage (set while profiling)

    def _make_loader(self) -> DataLoader:
        return call_user("building a DataLoader over the workload's dataset", self._loader)

    def _loader(self) -> DataLoader:
        # The shuffle has a generator of its own: the DataLoader's also seeds workers (once
        # per iterator), which would shift later epochs' order with persistent workers.
        # Under DDP each rank reads its own shard (an iterable dataset shards itself), in an
        # order fixed by the seed and the epoch count.
        iterable = isinstance(self.dataset, torch.utils.data.IterableDataset)
        self._epoch = 0
        if iterable:
            sampler = None
        elif self.rank is not None:
            sampler = torch.utils.data.DistributedSampler(self.dataset, num_replicas=self.rank.world_size,
                                                          rank=self.rank.rank, shuffle=True, seed=self.seed,
                                                          drop_last=True)
        else:
            sampler = torch.utils.data.RandomSampler(self.dataset, generator=torch.Generator().manual_seed(self.seed))
        with _workers_past_cores_allowed():
            return DataLoader(self.dataset, batch_size=self.rank_batch, sampler=sampler, drop_last=True,
                              generator=torch.Generator().manual_seed(self.seed + 1),
                              collate_fn=self.workload.collate_fn, **apply.dataloader_kwargs(self.config))

    @property
    def steps_per_epoch(self) -> int | None:
        """Optimizer steps in one pass over the dataset (None for an iterable without a length)."""
        try:
            return len(self.loader) or None
        except TypeError:
            return None

    @property
    def in_flight(self) -> int:
        """Batches the loader can hold ready at once: what a short window would overstate."""
        d = self.config.data
        return d.num_workers * (d.prefetch_factor or 2) if d.num_workers else 0

    def batches(self) -> Iterator[Any]:
        """An endless stream of global batches, epoch after epoch, in the seeded order."""
        empty_epochs = 0
        while True:
            got = False
            if isinstance(self.loader.sampler, torch.utils.data.DistributedSampler):
                self.loader.sampler.set_epoch(self._epoch)
            self._epoch += 1
            with _workers_past_cores_allowed():
                epoch = self._epoch_iter = iter(self.loader)
            for b in epoch:
                got = True
                yield b
            if not got:
                empty_epochs += 1
                if empty_epochs >= 1:
                    raise UserError(
                        f"Workload {self.workload.name!r}: the dataset yielded no batch of {self.rank_batch} "
                        "samples; give a dataset with at least batch_size samples."
                    )

    def settle(self) -> None:
        """After a stream is closed mid-epoch: receive (and drop) every batch its persistent workers
        were already asked for (`num_workers x prefetch_factor`), so they do not decode on the cores
        the next window is measured on. Other iterators are left as they are."""
        epoch, self._epoch_iter = self._epoch_iter, None
        if not getattr(epoch, "_persistent_workers", False) or not hasattr(epoch, "_get_data"):
            return
        while getattr(epoch, "_tasks_outstanding", 0) > 0:
            epoch._get_data()
            epoch._tasks_outstanding -= 1

    def _range(self, name: str):
        if not self.annotate:
            return _NULL
        return torch.profiler.record_function(f"autotune::{name}")

    def _micro_step(self, part: Any, clock) -> torch.Tensor:
        """Forward and backward of one micro-batch; the (scaled-down) loss, detached."""
        with self._autocast, apply.attention(self.config), self._range("forward"):
            loss = call_user("the workload's loss", self.workload.loss, self.step_model, part)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise UserError(
                f"Workload {self.workload.name!r}: loss(model, batch) returned {shape}, not a scalar tensor; "
                "reduce it (e.g. .mean()) before returning."
            )
        if not loss.requires_grad:
            raise UserError(
                f"Workload {self.workload.name!r}: loss(model, batch) returned a tensor without grad "
                "(requires_grad=False), so there is nothing to backpropagate; the loss must depend on the "
                "model's parameters (compute it from model(batch), and not under torch.no_grad() or .detach())."
            )
        if self.accum > 1 and not self.loss_sums:
            loss = loss / self.accum
        clock.mark("forward")
        with self._range("backward"):
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        clock.mark("backward")
        return loss.detach()

    def step(self, batch: Any, clock=None) -> torch.Tensor:
        """One optimizer step on a batch (the global one; this rank's share under DDP); returns the mean
        loss (not synchronised)."""
        clock = clock or NullClock()
        c = self.config
        if self._to_device:  # on CPU without channels_last every move is a no-op
            with self._range("h2d"):
                batch = apply.to_device(batch, c, self.device)
        clock.mark("h2d")
        total = None
        parts = apply.micro_batches(batch, c, self.rank_batch) if self.accum > 1 else (batch,)
        if self.accum > 1 and self.loss_sums is None:  # once, on the first batch
            self.loss_sums = reduction.sums_over_samples(self.model, self.workload.loss, batch, self.accum, self._autocast)
        for i, part in enumerate(parts):
            with apply.no_sync(self.step_model, last=i == len(parts) - 1):
                loss = self._micro_step(part, clock)
            total = loss if total is None else total + loss
        with self._range("optimizer"):
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        clock.mark("optimizer")
        self.steps_done += 1
        return total

    def backward_s(self, batch: Any, sync: bool) -> float:
        """Seconds of backward over one batch's micro-steps, with DDP's all-reduce (`sync`) or
        all of it under `no_sync()`; the gradients are dropped, the model is unchanged. A
        reference pass outside the measured windows (it synchronises a GPU to time itself)."""
        wait = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        if self._to_device:
            batch = apply.to_device(batch, self.config, self.device)
        parts = apply.micro_batches(batch, self.config, self.rank_batch) if self.accum > 1 else (batch,)
        clock = _BackwardTimer(wait)
        for i, part in enumerate(parts):
            with apply.no_sync(self.step_model, last=sync and i == len(parts) - 1):
                self._micro_step(part, clock)
        self.optimizer.zero_grad(set_to_none=True)
        return clock.total

    def gradient_bytes(self) -> int:
        """Bytes of gradient the ranks all-reduce per optimizer step (every trainable parameter)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)

    def close(self) -> None:
        """Leave the process group (DDP); nothing to do for one process."""
        if self.rank is not None:
            ranks.close_group()

    def train(self, steps: int) -> list[float]:
        """Production training for `steps` optimizer steps; the losses as floats."""
        return self.run(steps).losses

    def run(self, steps: int, warmup: int = 0) -> TrainRun:
        """Production training for `steps` steps, timing the steady state after `warmup` steps
        (synchronised only at the clock's two edges)."""
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        stream, losses = self.batches(), []
        t0 = t_warm = time.perf_counter()
        for i in range(steps):
            if i == warmup:
                sync()
                t_warm = time.perf_counter()
            losses.append(self.step(next(stream)))
        sync()
        t_end = time.perf_counter()
        return TrainRun([float(x) for x in losses], t_end - t0, t_end - t_warm, steps - min(warmup, steps))


class _BackwardTimer:
    """A clock for `Trainer.backward_s`: sums the backward stages it is shown."""

    def __init__(self, wait) -> None:
        self.wait, self.total, self._t = wait, 0.0, 0.0

    def mark(self, stage: str) -> None:
        self.wait()
        now = time.perf_counter()
        if stage == "backward":
            self.total += now - self._t
        self._t = now


def train_ranks(workload: Workload, config: TrainConfig, device: torch.device, seed: int, steps: int,
                warmup: int) -> tuple[TrainRun, float]:
    """`autotune train`: production training on every rank (rank 0 here, the others started
    as processes); rank 0's run and the setup time. One process without DDP."""
    check_applicable(workload, config, device)  # before any rank starts
    t0 = time.perf_counter()
    if config.distributed.world_size == 1:
        trainer = Trainer(workload, config, device, seed=seed)
        setup = time.perf_counter() - t0
        return trainer.run(steps, warmup), setup
    spec = ranks.RankSpec(0, config.distributed.world_size, ranks.free_port())
    peers = ranks.Peers(workload.source, spec)
    trainer = None
    try:
        peers.send({"cmd": "train", "target": workload.source, "config": config.flat(), "device": device.type,
                    "seed": seed, "steps": steps, "warmup": warmup})
        trainer = Trainer(workload, config, device, seed=seed, rank=spec)
        setup = time.perf_counter() - t0
        run = trainer.run(steps, warmup)
        peers.gather()
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt):
            cause = peers.failure()
            if cause is not None:
                peers.kill()
                raise UserError(f"{cause.reason} (training with {spec.world_size} ranks)\n{cause.detail}") from None
        peers.kill()
        raise
    finally:
        if trainer is not None:
            trainer.close()
    peers.close()
    return run, setup


@dataclass
class TrainRun:
    """What `Trainer.run` did: every loss, the wall time, and the steady-state window."""

    losses: list[float]
    wall_s: float
    steady_s: float
    steady_steps: int

    def steady_samples_per_s(self, batch_size: int) -> float:
        return self.steady_steps * batch_size / self.steady_s if self.steady_s > 0 else 0.0
