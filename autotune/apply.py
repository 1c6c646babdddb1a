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
            with autocast(config, device), attention(config):
                loss = loss_fn(model, micro) / accumulation_steps(config, B)
            (scaler.scale(loss) if scaler else loss).backward()
        ...

The division keeps the whole batch's gradient for a loss that averages its samples; one that
sums them is not divided (`autotune.reduction.sums_over_samples` tells which, as the trainer does).

Under DDP (`distributed.world_size > 1`, the process group initialised, e.g. by torchrun),
`prepare_model` wraps the model with `wrap_ddp` and returns the DDP module to call, B is the
per-rank batch, and each micro-step but the last runs under `no_sync(model, last=False)`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable

import torch
from torch.nn.modules.batchnorm import _NormBase

from . import batch as batching
from .config import TrainConfig
from .errors import ConfigError

@functools.cache
def default_threads() -> int:
    """The process's intra-op thread count before autotune first changed it: what
    `backend.num_threads: null` means (read on first use, never at import)."""
    return torch.get_num_threads()


def apply_backend(config: TrainConfig, device: torch.device | str) -> int:
    """Every process-wide setting `config` carries: intra-op threads, TF32 and cuDNN autotuning,
    an unset flag back to the value this process had before autotune first set it. Called before
    every window, so two configs sharing a process each run with their own. Returns the threads."""
    # Ranks on one machine share its cores: by default each takes its share of them.
    threads = config.backend.num_threads or max(1, default_threads() // config.distributed.world_size)
    torch.set_num_threads(threads)
    tf32 = config.precision.tf32
    for flag, value in ((_MATMUL, tf32), (_CONV, tf32), (_BENCHMARK, config.backend.cudnn_benchmark)):
        flag.want(value)
    return threads


class _Flag:
    """One process-wide flag of torch: set to what a config asks (a bool), or, unset, back to
    the value the process had before the first change; written only when it differs."""

    def __init__(self, owner: Callable[[], Any], name: str, values: tuple[Any, Any] = (False, True)) -> None:
        self.owner, self.name, self.values = owner, name, values
        self.initial: Any = None
        self.changed = False

    def want(self, value: bool | None) -> None:
        if value is None and not self.changed:
            return  # never set here: PyTorch's own value (or the user's) stands
        owner = self.owner()
        now = getattr(owner, self.name)
        target = self.initial if value is None else self.values[bool(value)]
        if not self.changed:
            self.initial, self.changed = now, True
        if now != target:
            setattr(owner, self.name, target)


def _precision_api() -> bool:
    """Whether this torch has the fp32_precision API (2.9 and later); mixing it with the legacy
    allow_tf32 flags raises, so only one of them is ever written."""
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


if _precision_api():
    _MATMUL = _Flag(lambda: torch.backends.cuda.matmul, "fp32_precision", ("ieee", "tf32"))
    _CONV = _Flag(lambda: torch.backends.cudnn.conv, "fp32_precision", ("ieee", "tf32"))
else:  # pragma: no cover - torch before 2.9
    _MATMUL = _Flag(lambda: torch.backends.cuda.matmul, "allow_tf32")
    _CONV = _Flag(lambda: torch.backends.cudnn, "allow_tf32")
_BENCHMARK = _Flag(lambda: torch.backends.cudnn, "benchmark")


def tf32_code(value: bool) -> str:
    """The lines that set TF32 for float32 matmuls and convolutions, in this torch's API."""
    if _precision_api():
        mode = "tf32" if value else "ieee"
        return (f'torch.backends.cuda.matmul.fp32_precision = "{mode}"; '
                f'torch.backends.cudnn.conv.fp32_precision = "{mode}"')
    return f"torch.backends.cuda.matmul.allow_tf32 = {value}; torch.backends.cudnn.allow_tf32 = {value}"


def dataloader_kwargs(config: TrainConfig) -> dict[str, Any]:
    """Keyword arguments for `torch.utils.data.DataLoader`."""
    d = config.data
    kw: dict[str, Any] = {"num_workers": d.num_workers, "pin_memory": d.pin_memory}
    if d.num_workers > 0:
        kw.update(prefetch_factor=d.prefetch_factor or 2, persistent_workers=d.persistent_workers)
    return kw


def wrap_checkpointing(model: torch.nn.Module, block_types: tuple[type, ...]) -> int:
    """Recompute each block of `block_types` in backward; returns how many were wrapped. Norm layers'
    running statistics (BatchNorm) are restored after each eager recomputation, so they update once
    a step, as in the untuned run."""
    from torch.utils.checkpoint import checkpoint

    wrapped = 0
    for module in model.modules():
        if isinstance(module, block_types):
            inner = module.forward
            norms = [m for m in module.modules() if isinstance(m, _NormBase) and m.track_running_stats]

            def forward(*args, _inner=inner, _norms=norms, **kwargs):
                if not torch.is_grad_enabled():
                    return _inner(*args, **kwargs)
                if _norms and not torch.compiler.is_compiling():
                    kwargs["context_fn"] = lambda: (contextlib.nullcontext(), _stats_kept(_norms))
                return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

            module.forward = forward
            wrapped += 1
    return wrapped


@contextlib.contextmanager
def _stats_kept(norms: list[torch.nn.Module]):
    """The norm layers' running statistics as they were before the block (a recomputation)."""
    saved = [[b.clone() for b in m.buffers(recurse=False)] for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, olds in zip(norms, saved):
                for b, old in zip(m.buffers(recurse=False), olds):
                    b.copy_(old)


def prepare_model(model: torch.nn.Module, config: TrainConfig, checkpoint_blocks: tuple[type, ...] = ()):
    """channels_last, activation checkpointing, DDP (world_size > 1), then torch.compile;
    returns `(model, step_model)`: the module to optimise and the one to call."""
    if config.layout.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if config.memory.activation_checkpointing:
        wrap_checkpointing(model, tuple(checkpoint_blocks))
    wrapped = wrap_ddp(model, config)
    step_model = wrapped if config.compile.mode == "none" else torch.compile(wrapped, mode=config.compile.mode)
    return model, step_model


def wrap_ddp(model: torch.nn.Module, config: TrainConfig, device: torch.device | str | None = None) -> torch.nn.Module:
    """The model in `DistributedDataParallel` with the config's `distributed.*` settings
    (bucket_cap_mb, gradient_as_bucket_view, static_graph); unchanged at world_size 1.

    The default process group must be initialised (torchrun, or `init_process_group`) with
    the config's world size; the model must already be on its device (`device`: the rank's
    GPU on CUDA, taken from the model's parameters when not given)."""
    d = config.distributed
    if d.world_size == 1:
        return model
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError([f"distributed.world_size {d.world_size} needs an initialised process group "
                           "(run under torchrun, or call torch.distributed.init_process_group first)"], "config")
    if dist.get_world_size() != d.world_size:
        raise ConfigError([f"distributed.world_size {d.world_size} does not match the process group's "
                           f"{dist.get_world_size()} ranks; use a config tuned for this world size"], "config")
    first = next(model.parameters(), None)
    dev = torch.device(device) if device is not None else (first.device if first is not None else torch.device("cpu"))
    ids = [dev] if dev.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=d.bucket_cap_mb,
                                   gradient_as_bucket_view=d.gradient_as_bucket_view, static_graph=d.static_graph)


def ddp_module(step_model: torch.nn.Module) -> torch.nn.Module | None:
    """The `DistributedDataParallel` inside `step_model` (compiled or not), or None."""
    from torch.nn.parallel import DistributedDataParallel

    inner = getattr(step_model, "_orig_mod", step_model)
    return inner if isinstance(inner, DistributedDataParallel) else None


def no_sync(step_model: torch.nn.Module, last: bool):
    """The context for one micro-step: DDP's `no_sync()` (gradients accumulate locally, no
    all-reduce) on all but the `last` micro-step of an optimizer step; a no-op without DDP."""
    ddp = ddp_module(step_model)
    return ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext()


_IMPLS = ("foreach", "fused")
# Per-instance switches torch's optimizers set in __init__ when built with fused=True.
_AMP_SCALING = "_step_supports_amp_scaling"
_FUSED_CHECK = "_need_device_dtype_check_for_fused"


def set_optimizer_impl(optimizer: torch.optim.Optimizer, config: TrainConfig, source: str = "config") -> torch.optim.Optimizer:
    """The optimizer switched to the foreach or fused implementation.

    Where the optimizer keeps the flag in its param groups (every torch.optim optimizer
    that has the form), the flag is set in place: the same object comes back, with its
    state and every group's hyper-parameters. Otherwise it is rebuilt with only the keyword
    arguments its constructor takes, and its state loaded into the new one. Either way the
    form is first tried on a throwaway instance on tiny parameters of the same devices and
    dtypes, so a form the optimizer or device cannot run is a ConfigError here, not a
    failure at the first step."""
    impl = config.optimizer.impl
    if impl == "default":
        return optimizer
    cls, name = type(optimizer), type(optimizer).__name__
    named = _init_keywords(cls)
    in_groups = impl in optimizer.defaults and all(impl in g for g in optimizer.param_groups)
    if impl not in named and not in_groups:
        raise ConfigError([f"optimizer.impl {impl}: {name} has no {impl} form; use default"], source)
    # The chosen flag on, the other one off wherever the optimizer knows it (never both on).
    flags = {k: k == impl for k in _IMPLS if k == impl or k in named or k in optimizer.defaults}
    try:
        probe = _probe_optimizer_impl(optimizer, impl, flags, named)
    except Exception as exc:  # whatever the optimizer raises where the form cannot run here
        raise ConfigError([f"optimizer.impl {impl}: {name} refused it here ({exc}); use default"], source) from None
    if in_groups:
        _switch_in_place(optimizer, flags, probe)
        return optimizer
    return _rebuild_optimizer(optimizer, impl, flags, named, source)


def _init_keywords(cls: type) -> set[str]:
    """The keyword arguments `cls(params, ...)` names in its signature."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return set()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {n for n, p in params.items() if p.kind in kinds} - {"self", "params"}


def _ctor_kwargs(optimizer: torch.optim.Optimizer, flags: dict[str, bool], named: set[str]) -> dict[str, Any]:
    """The optimizer's defaults (and the flags) its constructor takes as keyword arguments:
    `defaults` also holds keys it does not (AdamW's decoupled_weight_decay)."""
    return {k: v for k, v in {**optimizer.defaults, **flags}.items() if k in named}


def _probe_optimizer_impl(optimizer: torch.optim.Optimizer, impl: str, flags: dict[str, bool],
                          named: set[str]) -> torch.optim.Optimizer:
    """A throwaway instance of the optimizer's class with the flags, over one tiny parameter
    per device/dtype/rank of each group and with that group's hyper-parameters, stepped once:
    raises what torch raises (at build or at step) where the form cannot run here."""
    if impl == "fused":
        _check_fused_devices(optimizer)
    groups = []
    for group in optimizer.param_groups:
        kinds = {(p.device, p.dtype, p.dim()) for p in group["params"]}
        tiny = []
        for device, dtype, dim in sorted(kinds, key=str):
            t = torch.zeros((1,) * dim, device=device, dtype=dtype)
            if t.is_floating_point() or t.is_complex():
                t.requires_grad_(True)
            tiny.append(t)
        if tiny:
            extra = {k: v for k, v in group.items() if k not in ("params", "param_names")}
            groups.append({**extra, **flags, "params": tiny})
    if not groups:  # nothing to optimise: still try the constructor with the flag
        groups = [{**flags, "params": [torch.zeros(1, requires_grad=True)]}]
    probe = type(optimizer)(groups, **_ctor_kwargs(optimizer, flags, named))
    for group in probe.param_groups:
        if impl in group and group[impl] is not True:
            raise RuntimeError(f"its param groups kept {impl}={group[impl]!r}")
        for t in group["params"]:
            t.grad = torch.zeros_like(t)
    probe.step()
    return probe


def _check_fused_devices(optimizer: torch.optim.Optimizer) -> None:
    """torch's rule for fused optimizers: floating-point parameters on a device with fused
    kernels (torch applies it lazily, and some optimizers to the first parameter only)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:  # the probe's step still tries the kernels
        return
    supported = _get_fused_kernels_supported_devices()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not (p.device.type in supported and torch.is_floating_point(p)):
                raise RuntimeError(f"fused=True needs floating-point parameters on one of {supported}, "
                                   f"not {p.dtype} on {p.device.type}")


def _switch_in_place(optimizer: torch.optim.Optimizer, flags: dict[str, bool], probe: torch.optim.Optimizer) -> None:
    """Set the flags on every param group and on `defaults` (for groups added later), keeping
    the object, its state and hyper-parameters; then what torch's constructor would have
    set for the form, and the state in the form it expects."""
    optimizer.defaults.update(flags)
    for group in optimizer.param_groups:
        group.update(flags)
    # GradScaler hands the scale to fused steps (and must not to the others).
    if hasattr(probe, _AMP_SCALING) or hasattr(optimizer, _AMP_SCALING):
        setattr(optimizer, _AMP_SCALING, getattr(probe, _AMP_SCALING, False))
    if hasattr(probe, _FUSED_CHECK):
        setattr(optimizer, _FUSED_CHECK, True)
    # Fused (like capturable) steps keep `step` as float32 on the parameter's device:
    # move it there as torch's own load_state_dict does.
    for group in optimizer.param_groups:
        if not (group.get("fused") or group.get("capturable")):
            continue
        for p in group["params"]:
            state = optimizer.state.get(p)
            step = state.get("step") if isinstance(state, dict) else None
            if isinstance(step, torch.Tensor):
                state["step"] = step.to(dtype=torch.float32, device=p.device)


def _rebuild_optimizer(optimizer: torch.optim.Optimizer, impl: str, flags: dict[str, bool], named: set[str],
                       source: str) -> torch.optim.Optimizer:
    """A new instance of the optimizer's class with the flag (for optimizers that do not keep
    it in their param groups), taking only the keyword arguments its constructor names; the
    old one's state is loaded into it."""
    cls = type(optimizer)
    groups = [{**g, **{k: v for k, v in flags.items() if k in g}} for g in optimizer.param_groups]
    try:
        rebuilt = cls(groups, **_ctor_kwargs(optimizer, flags, named))
        if optimizer.state:
            saved = optimizer.state_dict()
            for g in saved["param_groups"]:  # loading restores the groups' own entries
                g.update({k: v for k, v in flags.items() if k in g})
            rebuilt.load_state_dict(saved)
    except Exception as exc:
        raise ConfigError([f"optimizer.impl {impl}: {cls.__name__} refused it here ({exc}); use default"],
                          source) from None
    return rebuilt


def attention(config: TrainConfig):
    """A fresh context for one forward pass: the config's SDPA kernel (`sdpa_kernel`), or none."""
    if config.attention.backend == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, config.attention.backend))


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
