"""Apply a `TrainConfig` in a hand-written training loop: the same functions the measured
loop (`autotune.loop.Trainer`) is built from, so production runs what was measured.

    config = autotune.load_config("tuned.yaml")
    apply_backend(config, device)
    model = prepare_model(model.to(device), config, checkpoint_blocks=(Block,))
    optimizer = set_optimizer_impl(optimizer, config)
    loader = DataLoader(dataset, batch_size=B, shuffle=True, **dataloader_kwargs(config))
    scaler = grad_scaler(config, device)
    for batch in loader:
        for micro in micro_batches(batch, config, B):
            with autocast(config, device):
                loss = loss_fn(model, micro) / accumulation_steps(config, B)
            (scaler.scale(loss) if scaler else loss).backward()
        ...
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any

import torch

from . import batch as batching
from .config import TrainConfig
from .errors import ConfigError

@functools.cache
def default_threads() -> int:
    """The process's intra-op thread count before autotune first changed it: what
    `backend.num_threads: null` means (read on first use, never at import)."""
    return torch.get_num_threads()


def apply_backend(config: TrainConfig, device: torch.device | str) -> int:
    """Intra-op threads, TF32 and cuDNN autotuning; returns the thread count set."""
    threads = config.backend.num_threads or default_threads()
    torch.set_num_threads(threads)
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = config.precision.tf32
        torch.backends.cudnn.allow_tf32 = config.precision.tf32
        torch.backends.cudnn.benchmark = config.backend.cudnn_benchmark
    return threads


def dataloader_kwargs(config: TrainConfig) -> dict[str, Any]:
    """Keyword arguments for `torch.utils.data.DataLoader`."""
    d = config.data
    kw: dict[str, Any] = {"num_workers": d.num_workers, "pin_memory": d.pin_memory}
    if d.num_workers > 0:
        kw.update(prefetch_factor=d.prefetch_factor or 2, persistent_workers=d.persistent_workers)
    return kw


def wrap_checkpointing(model: torch.nn.Module, block_types: tuple[type, ...]) -> int:
    """Recompute each block of `block_types` in backward; returns how many were wrapped."""
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


def prepare_model(model: torch.nn.Module, config: TrainConfig, checkpoint_blocks: tuple[type, ...] = ()):
    """channels_last, activation checkpointing, then torch.compile; returns
    `(model, step_model)`: the module to optimise and the one to call (compiled or not)."""
    if config.layout.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if config.memory.activation_checkpointing:
        wrap_checkpointing(model, tuple(checkpoint_blocks))
    step_model = model if config.compile.mode == "none" else torch.compile(model, mode=config.compile.mode)
    return model, step_model


def set_optimizer_impl(optimizer: torch.optim.Optimizer, config: TrainConfig, source: str = "config") -> torch.optim.Optimizer:
    """The same optimizer rebuilt with the foreach or fused implementation."""
    impl = config.optimizer.impl
    if impl == "default":
        return optimizer
    cls = type(optimizer)
    params = inspect.signature(cls.__init__).parameters
    if impl not in params:
        raise ConfigError([f"optimizer.impl {impl}: {cls.__name__} has no {impl} form; use default"], source)
    flags = {"foreach": impl == "foreach", "fused": impl == "fused"}
    flags = {k: v for k, v in flags.items() if k in params}
    groups = [{**g, **flags} for g in optimizer.param_groups]
    try:
        return cls(groups, **{**optimizer.defaults, **flags})
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ConfigError([f"optimizer.impl {impl}: {cls.__name__} refused it here ({exc}); use default"], source) from None


def autocast(config: TrainConfig, device: torch.device | str):
    """The autocast context for the forward pass (a no-op without AMP)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.precision.amp)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def grad_scaler(config: TrainConfig, device: torch.device | str) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16, else None."""
    return torch.amp.GradScaler(torch.device(device).type) if config.precision.amp == "fp16" else None


def accumulation_steps(config: TrainConfig, batch_size: int) -> int:
    """Micro-steps per optimizer step; the global batch stays `batch_size`."""
    return batch_size // (config.memory.micro_batch_size or batch_size)


def micro_batches(batch: Any, config: TrainConfig, batch_size: int) -> list[Any]:
    """The global batch split into equal micro-batches along dim 0."""
    return batching.split(batch, accumulation_steps(config, batch_size))


def to_device(batch: Any, config: TrainConfig, device: torch.device | str) -> Any:
    """Move a batch with the config's non_blocking and channels_last settings."""
    return batching.to_device(batch, torch.device(device), config.data.non_blocking, config.layout.channels_last)
