"""The training loop: applies every `TrainConfig` knob for real, on CPU and CUDA.

This is the code path that is measured and the one `autotune train` runs in production.
A config never changes the effective batch or the data seen: the DataLoader always yields
the global batch in the same seeded order, and gradient accumulation splits it on device.
Stage boundaries are reported to a clock (`mark(stage)`) that adds no synchronisation.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import warnings
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader

from . import batch as batching
from .config import TrainConfig
from .errors import ConfigError, UserError, call_user
from .workload import Workload

DEFAULT_THREADS = torch.get_num_threads()
# More workers than cores is a knob autotune measures on purpose, not a mistake to warn about.
warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)


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


def has_conv(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())


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
    if config.compile.mode != "none" and os.name == "nt":
        errors.append("compile.mode needs a platform torch.compile supports; use none")
    if errors:
        raise ConfigError(errors, f"config for workload {workload.name!r} on {device.type}")


def _wrap_checkpointing(model: torch.nn.Module, block_types: tuple[type, ...]) -> int:
    from torch.utils.checkpoint import checkpoint

    wrapped = 0
    for module in model.modules():
        if isinstance(module, block_types):
            inner = module.forward

            def forward(*args, _inner=inner, **kwargs):
                if torch.is_grad_enabled():
                    return checkpoint(_inner, *args, use_reentrant=False, **kwargs)
                return _inner(*args, **kwargs)

            module.forward = forward
            wrapped += 1
    return wrapped


def _set_impl(optimizer: torch.optim.Optimizer, impl: str, name: str) -> torch.optim.Optimizer:
    """Rebuild the user's optimizer with the foreach or fused implementation."""
    if impl == "default":
        return optimizer
    cls = type(optimizer)
    if impl not in inspect.signature(cls.__init__).parameters:
        raise ConfigError([f"optimizer.impl {impl}: {cls.__name__} has no {impl} form; use default"], f"config for workload {name!r}")
    flags = {"foreach": impl == "foreach", "fused": impl == "fused"}
    if "foreach" not in inspect.signature(cls.__init__).parameters:
        flags.pop("foreach")
    groups = [{**g, **flags} for g in optimizer.param_groups]
    try:
        return cls(groups, **{**optimizer.defaults, **flags})
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ConfigError([f"optimizer.impl {impl}: {cls.__name__} refused it here ({exc}); use default"], f"config for workload {name!r}") from None


class Trainer:
    """A model, optimizer and data loader built from a workload and a config, ready to step."""

    def __init__(self, workload: Workload, config: TrainConfig, device: torch.device, seed: int = 0) -> None:
        check_applicable(workload, config, device)
        self.workload, self.config, self.device, self.seed = workload, config, device, seed
        self.threads = config.backend.num_threads or DEFAULT_THREADS
        torch.set_num_threads(self.threads)
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = config.precision.tf32
            torch.backends.cudnn.allow_tf32 = config.precision.tf32
            torch.backends.cudnn.benchmark = config.backend.cudnn_benchmark
        torch.manual_seed(seed)
        model = call_user("the workload's model factory", workload.model)
        if not isinstance(model, torch.nn.Module):
            raise UserError(f"Workload {workload.name!r}: model() returned {type(model).__name__}, not a torch.nn.Module.")
        self.has_conv = has_conv(model)
        model = model.to(device)
        if config.layout.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if config.memory.activation_checkpointing:
            _wrap_checkpointing(model, workload.checkpoint_blocks)
        model.train()
        optimizer = call_user("the workload's optimizer factory", workload.optimizer, model.parameters())
        self.optimizer = _set_impl(optimizer, config.optimizer.impl, workload.name)
        self.model = model
        self.step_model = model if config.compile.mode == "none" else torch.compile(model, mode=config.compile.mode)
        amp = config.precision.amp
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
        self.scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
        self.accum = workload.batch_size // (config.memory.micro_batch_size or workload.batch_size)
        self.dataset = workload.make_dataset()
        self.loader = self._make_loader()
        self.steps_done = 0
        self.annotate = False  # named profiler ranges per stage (set while profiling)

    def _make_loader(self) -> DataLoader:
        d = self.config.data
        # The shuffle has a generator of its own: the DataLoader's also seeds workers (once
        # per iterator), which would shift later epochs' order with persistent workers.
        iterable = isinstance(self.dataset, torch.utils.data.IterableDataset)
        sampler = None if iterable else torch.utils.data.RandomSampler(
            self.dataset, generator=torch.Generator().manual_seed(self.seed))
        kwargs: dict[str, Any] = dict(
            batch_size=self.workload.batch_size,
            sampler=sampler,
            drop_last=True,
            generator=torch.Generator().manual_seed(self.seed + 1),
            num_workers=d.num_workers,
            pin_memory=d.pin_memory,
            collate_fn=self.workload.collate_fn,
        )
        if d.num_workers > 0:
            kwargs.update(prefetch_factor=d.prefetch_factor or 2, persistent_workers=d.persistent_workers)
        return DataLoader(self.dataset, **kwargs)

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
            for b in self.loader:
                got = True
                yield b
            if not got:
                empty_epochs += 1
                if empty_epochs >= 1:
                    raise UserError(
                        f"Workload {self.workload.name!r}: the dataset yielded no batch of {self.workload.batch_size} "
                        "samples; give a dataset with at least batch_size samples."
                    )

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _range(self, name: str):
        if not self.annotate:
            return contextlib.nullcontext()
        return torch.profiler.record_function(f"autotune::{name}")

    def step(self, batch: Any, clock=None) -> torch.Tensor:
        """One optimizer step on a global batch; returns the mean loss (not synchronised)."""
        clock = clock or NullClock()
        c = self.config
        with self._range("h2d"):
            batch = batching.to_device(batch, self.device, c.data.non_blocking, c.layout.channels_last)
        clock.mark("h2d")
        total = None
        for part in batching.split(batch, self.accum):
            with self._autocast(), self._range("forward"):
                loss = call_user("the workload's loss", self.workload.loss, self.step_model, part)
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise UserError(
                    f"Workload {self.workload.name!r}: loss(model, batch) returned {shape}, not a scalar tensor; "
                    "reduce it (e.g. .mean()) before returning."
                )
            if self.accum > 1:
                loss = loss / self.accum
            clock.mark("forward")
            with self._range("backward"):
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            clock.mark("backward")
            total = loss.detach() if total is None else total + loss.detach()
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

    def train(self, steps: int) -> list[float]:
        """Production training for `steps` optimizer steps; the losses as floats."""
        losses = []
        stream = self.batches()
        for _ in range(steps):
            losses.append(self.step(next(stream)))
        return [float(x) for x in losses]


def check_finite(losses: list[float]) -> bool:
    return all(math.isfinite(x) for x in losses)
