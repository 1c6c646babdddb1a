"""`Workload`: what the user trains, as factories, and loading it from a target string.

Targets are `path/to/file.py`, `path/to/file.py:func` or `package.module:func`; the
function (default name `workload`) takes no arguments and returns a `Workload`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .errors import UserError, call_user


@dataclass
class Workload:
    """A training step described by factories, so each measurement starts fresh and seeded.

    Attributes:
        name: Shown in reports.
        model: Factory returning a fresh `nn.Module`.
        dataset: A `Dataset`, or a factory returning one.
        optimizer: Factory taking the model's parameters, returning an optimizer.
        loss: `loss(model, batch) -> scalar tensor`, with the batch already on the device.
        batch_size: The global batch per optimizer step; autotune never changes it.
        collate_fn: Optional, passed to the DataLoader.
        checkpoint_blocks: Module types that activation checkpointing may wrap.
    """

    name: str
    model: Callable[[], torch.nn.Module]
    dataset: Any
    optimizer: Callable[[Any], torch.optim.Optimizer]
    loss: Callable[[torch.nn.Module, Any], torch.Tensor]
    batch_size: int
    collate_fn: Callable | None = None
    checkpoint_blocks: tuple[type, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        errors = []
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            errors.append(f"batch_size must be a positive int, got {self.batch_size!r}")
        for name in ("model", "optimizer", "loss"):
            if not callable(getattr(self, name)):
                errors.append(f"{name} must be callable (a factory or function), got {type(getattr(self, name)).__name__}")
        self.checkpoint_blocks = tuple(self.checkpoint_blocks or ())
        if errors:
            raise UserError(f"Workload {self.name!r} is invalid: " + "; ".join(errors) + ".")

    def make_dataset(self) -> Any:
        ds = self.dataset
        if callable(ds) and not isinstance(ds, torch.utils.data.Dataset):
            ds = call_user("the workload's dataset factory", ds)
        try:
            n = len(ds)
        except TypeError:
            n = None
        if n is not None and n < self.batch_size:
            raise UserError(
                f"Workload {self.name!r}: the dataset yields {n} sample(s), fewer than one batch of "
                f"{self.batch_size}; give a dataset with at least batch_size samples."
            )
        return ds


def has_conv(model: torch.nn.Module) -> bool:
    """Whether the model has convolutions (what channels_last can speed up)."""
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())


def facts(workload: Workload) -> dict[str, bool]:
    """What recipes may require, found by looking at a freshly built model."""
    torch.manual_seed(0)
    model = call_user("the workload's model factory", workload.model)
    return {"conv": has_conv(model), "checkpoint_blocks": bool(workload.checkpoint_blocks)}


def load_module_from_file(path: Path, target: str):
    """Import a workload file once; its folder is on `sys.path` only while it imports
    (so it can import its neighbours) and `sys.path` is left as it was."""
    if not path.is_file():
        raise UserError(f"target {target!r}: file {str(path)!r} does not exist; give a path to a Python file that defines `workload()`.")
    mod_name = f"_autotune_target_{abs(hash(str(path.resolve())))}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    saved = list(sys.path)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        call_user(f"importing {path}", spec.loader.exec_module, module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    finally:
        sys.path[:] = saved
    return module


def load_workload(target: str) -> Workload:
    """Import the target and call its function; the result must be a `Workload`."""
    target = str(target)
    path_part, sep, func_name = target.rpartition(":") if ":" in target else (target, "", "")
    func_name = func_name or "workload"
    if path_part.endswith(".py") or "/" in path_part or Path(path_part).suffix == ".py":
        module = load_module_from_file(Path(path_part), target)
    else:
        if not path_part:
            raise UserError(f"target {target!r} is empty: write file.py, file.py:func or package.module:func.")
        try:
            module = importlib.import_module(path_part)
        except ModuleNotFoundError as exc:
            if exc.name and path_part.startswith(exc.name):
                raise UserError(
                    f"target {target!r}: no module named {exc.name!r}; give a file path ending in .py "
                    "or an importable module (package.module:func)."
                ) from None
            raise UserError(f"target {target!r}: importing it failed: {exc}") from None
    fn = getattr(module, func_name, None)
    if fn is None or not callable(fn):
        raise UserError(
            f"target {target!r} has no function {func_name!r}; define `def {func_name}() -> autotune.Workload` "
            "or name the function after a colon (file.py:my_func)."
        )
    wl = call_user(f"{func_name}() in {target}", fn)
    if not isinstance(wl, Workload):
        raise UserError(
            f"target {target!r}: {func_name}() returned {type(wl).__name__}, not an autotune.Workload; "
            "return autotune.Workload(name=..., model=..., dataset=..., optimizer=..., loss=..., batch_size=...)."
        )
    return wl
