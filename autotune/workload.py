"""`Workload`: what the user trains, as factories, and loading it from a target string.

Targets are `path/to/file.py`, `path/to/file.py:func` or `package.module:func`; the
function (default name `workload`) takes no arguments and returns a `Workload`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .config import TrainConfig
from .errors import UserCodeError, UserError, call_user


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
        world_size: Processes training together with DistributedDataParallel (1: no DDP);
            each rank draws `batch_size / world_size` samples per step, so it must divide.
    """

    name: str
    model: Callable[[], torch.nn.Module]
    dataset: Any
    optimizer: Callable[[Any], torch.optim.Optimizer]
    loss: Callable[[torch.nn.Module, Any], torch.Tensor]
    batch_size: int
    collate_fn: Callable | None = None
    checkpoint_blocks: tuple[type, ...] = field(default_factory=tuple)
    world_size: int = 1
    # The target it was loaded from (set by `load_workload`): what the other ranks load.
    source: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Every field valid, all errors in one `UserError`: at construction and again before each
        use, so a field changed after construction is caught where it would fail."""
        errors = []
        if not isinstance(self.name, str) or not self.name.strip():
            errors.append(f"name must be a non-empty string, got {_short(self.name)}")
        elif not _utf8(self.name):
            errors.append("name must be text that can be written as UTF-8 (it holds a lone surrogate)")
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            errors.append(f"batch_size must be a positive int, got {_short(self.batch_size)}")
        for name in ("model", "optimizer", "loss"):
            if not callable(getattr(self, name)):
                errors.append(f"{name} must be callable (a factory or function), got {type(getattr(self, name)).__name__}")
        if not (callable(self.dataset) or _dataset_like(self.dataset)):
            errors.append(f"dataset must be a torch Dataset (or anything with __getitem__ and __len__, or __iter__) "
                          f"or a factory returning one, got {type(self.dataset).__name__}")
        if not isinstance(self.world_size, int) or isinstance(self.world_size, bool) or self.world_size < 1:
            errors.append(f"world_size must be a positive int (processes training together), got {_short(self.world_size)}")
        elif isinstance(self.batch_size, int) and self.batch_size % self.world_size:
            errors.append(f"batch_size {self.batch_size} (the global batch) must divide evenly over world_size "
                          f"{self.world_size} ranks; give a multiple of {self.world_size}")
        if self.collate_fn is not None and not callable(self.collate_fn):
            errors.append(f"collate_fn must be callable or None, got {type(self.collate_fn).__name__}")
        blocks = self.checkpoint_blocks
        if isinstance(blocks, type):
            blocks = (blocks,)
        try:
            blocks = tuple(blocks or ())
        except TypeError:
            errors.append(f"checkpoint_blocks must be a tuple of module classes, got {type(blocks).__name__}")
            blocks = ()
        bad = [b for b in blocks if not isinstance(b, type)]
        if bad:
            errors.append(f"checkpoint_blocks must hold module classes (like MyBlock), not instances or other "
                          f"values: got {_short(bad[0])}")
        self.checkpoint_blocks = blocks
        if errors:
            label = repr(self.name) if isinstance(self.name, str) else "(unnamed)"
            raise UserError(f"Workload {label} is invalid: " + "; ".join(errors) + ".")

    @property
    def rank_batch(self) -> int:
        """Samples each rank draws per optimizer step (the global batch with one process)."""
        return self.batch_size // self.world_size

    def base_config(self) -> TrainConfig:
        """The default config for this workload: defaults everywhere, its world size recorded."""
        return TrainConfig().with_changes({"distributed.world_size": self.world_size})

    def make_dataset(self) -> Any:
        ds = self.dataset
        if callable(ds) and not isinstance(ds, torch.utils.data.Dataset):
            ds = call_user("the workload's dataset factory", ds)
            if not _dataset_like(ds):
                raise UserError(
                    f"Workload {self.name!r}: the dataset factory returned {type(ds).__name__}, not a dataset; "
                    "return a torch Dataset (or anything with __getitem__ and __len__, or __iter__)."
                )
        try:
            n = len(ds)
        except TypeError:  # an iterable dataset has no length
            n = None
        except Exception as exc:  # noqa: BLE001 - the dataset's own __len__ failed (or returned < 0)
            raise UserCodeError("len() of the workload's dataset", exc) from exc
        if n is not None and n < self.batch_size:
            raise UserError(
                f"Workload {self.name!r}: the dataset yields {n} sample(s), fewer than one batch of "
                f"{self.batch_size}; give a dataset with at least batch_size samples."
            )
        return ds


def _short(value: Any) -> str:
    """A value's repr for a message, cut to a line."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _dataset_like(ds: Any) -> bool:
    """What a DataLoader can draw samples from: a map-style or an iterable dataset."""
    if ds is None or isinstance(ds, (str, bytes, int, float, bool)):
        return False
    if isinstance(ds, torch.utils.data.Dataset):
        return True
    return (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")) or hasattr(ds, "__iter__")


def has_conv(model: torch.nn.Module) -> bool:
    """Whether the model has convolutions (what channels_last can speed up)."""
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())


def calls_sdpa(workload: Workload, model: torch.nn.Module, dataset: Any) -> bool:
    """Whether the loss of a two-sample batch calls `torch.nn.functional.scaled_dot_product_attention`
    (what the attention recipe acts on); False where that probe cannot run (the run says why)."""
    from torch.utils.data import default_collate

    functional, seen = torch.nn.functional, []
    original = functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(True)
        return original(*args, **kwargs)

    functional.scaled_dot_product_attention = spy  # looked up at call time, by nn.MultiheadAttention too
    try:
        batch = (workload.collate_fn or default_collate)([dataset[i] for i in range(min(2, len(dataset)))])
        with torch.no_grad():
            workload.loss(model, batch)
    except Exception:  # noqa: BLE001 - a probe: the measured run reports the workload's own errors
        return False
    finally:
        functional.scaled_dot_product_attention = original
    return bool(seen)


def facts(workload: Workload) -> dict[str, bool]:
    """What recipes may require, found by looking at a freshly built model and dataset."""
    from .shards import repeats_in_workers

    torch.manual_seed(0)
    model = call_user("the workload's model factory", workload.model)
    dataset = workload.make_dataset()
    return {"conv": has_conv(model), "checkpoint_blocks": bool(workload.checkpoint_blocks),
            "distributed": workload.world_size > 1, "sdpa": calls_sdpa(workload, model, dataset),
            "repeats_in_workers": repeats_in_workers(dataset, workload.rank_batch, workload.collate_fn)}


def load_module_from_file(path: Path, target: str):
    """Import a workload file once; its folder is on `sys.path` only while it imports
    (so it can import its neighbours) and `sys.path` is left as it was."""
    if path.is_dir():
        raise UserError(f"target {target!r}: {str(path)!r} is a folder, not a Python file; "
                        "give the path of the .py file that defines `workload()`.")
    if not path.is_file():
        raise UserError(f"target {target!r}: file {str(path)!r} does not exist; give a path to a Python file that defines `workload()`.")
    if path.suffix != ".py":
        raise UserError(f"target {target!r}: {str(path)!r} is not a Python file (its name does not end in .py); "
                        "give the .py file that defines `workload()`.")
    if not os.access(path, os.R_OK):
        raise UserError(f"target {target!r}: file {str(path)!r} cannot be read (permission denied); "
                        "give a file you can read.")
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


def _import_module(name: str, target: str):
    """Import `package.module`; a module that is not there is bad input, anything its own
    code raises while importing is an error in the user's code (with their traceback)."""
    if not all(part.isidentifier() for part in name.split(".")):
        raise UserError(
            f"target {target!r}: {name!r} is neither a .py file nor a module name; write a path to a file "
            "(file.py, ./file.py:func) or an absolute dotted module name (package.module:func; "
            "relative names like .module are not supported)."
        )
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise UserError(
                f"target {target!r}: no module named {exc.name!r}; give a file path ending in .py "
                "or an importable module (package.module:func)."
            ) from None
        raise UserCodeError(f"importing {name}", exc) from exc
    except (UserError, UserCodeError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - the module's own code failed while importing
        raise UserCodeError(f"importing {name}", exc) from exc


def load_workload(target: str) -> Workload:
    """Import the target and call its function; the result must be a `Workload`."""
    target = str(target)
    path_part, sep, func_name = target.rpartition(":") if ":" in target else (target, "", "")
    if sep and not func_name.strip():
        raise UserError(f"target {target!r} has nothing after the colon; write file.py:func or package.module:func, "
                        "or leave out the colon to call `workload()`.")
    if sep and not func_name.isidentifier():
        raise UserError(f"target {target!r}: {func_name!r} after the colon is not a Python function name; "
                        "write file.py:func or package.module:func.")
    func_name = func_name or "workload"
    if path_part.endswith(".py") or "/" in path_part or Path(path_part).suffix == ".py":
        module = load_module_from_file(Path(path_part), target)
    else:
        if not path_part:
            raise UserError(f"target {target!r} is empty: write file.py, file.py:func or package.module:func.")
        module = _import_module(path_part, target)
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
    wl.source = target
    return wl


def with_world_size(workload: Workload, world_size: int | None) -> Workload:
    """The workload with its world size replaced (a `--world-size` flag); checked as a new one."""
    if world_size is None or world_size == workload.world_size:
        return workload
    import dataclasses

    out = dataclasses.replace(workload, world_size=world_size)
    out.source = workload.source
    return out
