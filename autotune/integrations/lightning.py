"""A `LightningModule` as an `autotune.Workload`.

The loss is the module's own `training_step(batch, batch_idx)` output (a tensor, or a dict
with "loss"); the optimizer is the first one `configure_optimizers()` returns (schedulers
and any further optimizers are left out, with a warning); the dataset, collate function and
batch size come from `train_dataloader()` (the module's, or the datamodule's), unless given.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from autotune.errors import UserError, call_user
from autotune.workload import Workload

from . import require


def _first_optimizer(result: Any, where: str) -> tuple[torch.optim.Optimizer, int]:
    """The first optimizer of anything `configure_optimizers` may return, and how many there are."""
    if isinstance(result, torch.optim.Optimizer):
        return result, 1
    if isinstance(result, dict):
        opt = result.get("optimizer")
        if isinstance(opt, torch.optim.Optimizer):
            return opt, 1
    if isinstance(result, (list, tuple)) and result:
        # ([optimizers], [schedulers]) or [optimizer, ...] or [{"optimizer": ...}, ...]
        items = result[0] if isinstance(result[0], (list, tuple)) else result
        found = []
        for item in items:
            if isinstance(item, torch.optim.Optimizer):
                found.append(item)
            elif isinstance(item, dict) and isinstance(item.get("optimizer"), torch.optim.Optimizer):
                found.append(item["optimizer"])
        if found:
            return found[0], len(found)
    raise UserError(f"{where} returned {type(result).__name__}, not an optimizer (or a list, tuple or dict holding "
                    "one); return torch.optim.AdamW(self.parameters(), ...) or {'optimizer': ...}.")


def _loss_of(out: Any) -> torch.Tensor:
    if isinstance(out, dict):
        out = out.get("loss")
    if not isinstance(out, torch.Tensor):
        raise UserError(f"training_step returned {type(out).__name__}, not a loss tensor (or a dict with 'loss'); "
                        "autotune measures the step the returned loss drives.")
    return out


def workload(module_factory: Callable[[], Any], datamodule: Any = None, dataset: Any = None,
             collate_fn: Callable | None = None, batch_size: int | None = None, name: str | None = None) -> Workload:
    """An `autotune.Workload` that trains the LightningModule `module_factory()` builds.

    Args:
        module_factory: Returns a fresh `LightningModule` (called once here, once per measurement).
        datamodule: A `LightningDataModule` whose `train_dataloader()` gives the data
            (its `prepare_data()` and `setup("fit")` are called first).
        dataset, collate_fn, batch_size: Override what `train_dataloader()` gives.
        name: Shown in reports (default: the module's class name).

    Raises:
        UserError: Lightning is not installed, or the module gives no data, batch size or optimizer.
    """
    pl = require("lightning", "lightning", "autotune.integrations.lightning")
    if not callable(module_factory):
        raise UserError(f"module_factory must be a function returning a LightningModule, got "
                        f"{type(module_factory).__name__}.")
    probe = call_user("the LightningModule factory", module_factory)
    if not isinstance(probe, pl.LightningModule):
        raise UserError(f"module_factory returned {type(probe).__name__}, not a lightning.LightningModule.")
    if dataset is None or batch_size is None:
        source = datamodule if datamodule is not None else probe
        if datamodule is not None:
            call_user("the datamodule's prepare_data", datamodule.prepare_data)
            call_user("the datamodule's setup", datamodule.setup, "fit")
        loader = call_user(f"{type(source).__name__}.train_dataloader", source.train_dataloader)
        if not isinstance(loader, torch.utils.data.DataLoader):
            raise UserError(f"{type(source).__name__}.train_dataloader() returned {type(loader).__name__}, not one "
                            "torch DataLoader; pass dataset=, collate_fn= and batch_size= instead.")
        dataset = loader.dataset if dataset is None else dataset
        collate_fn = loader.collate_fn if collate_fn is None else collate_fn
        batch_size = loader.batch_size if batch_size is None else batch_size
        if batch_size is None:
            raise UserError(f"{type(source).__name__}.train_dataloader() uses a batch sampler, so its batch size is "
                            "unknown; pass batch_size=N.")
    _, count = _first_optimizer(call_user("configure_optimizers", probe.configure_optimizers),
                                f"{type(probe).__name__}.configure_optimizers()")
    if count > 1:
        warnings.warn(f"{type(probe).__name__}.configure_optimizers() returns {count} optimizers; autotune measures "
                      "the step with the first one only.", stacklevel=2)
    built: list[Any] = []

    def model() -> torch.nn.Module:
        module = module_factory()
        built[:] = [module]
        return module

    def optimizer(params) -> torch.optim.Optimizer:
        module = built[0]
        result = call_user("configure_optimizers", module.configure_optimizers)
        return _first_optimizer(result, f"{type(module).__name__}.configure_optimizers()")[0]

    def loss(module: torch.nn.Module, batch: Any) -> torch.Tensor:
        with warnings.catch_warnings():  # self.log() without a Trainer only warns
            warnings.filterwarnings("ignore", message=".*self.log.*")
            warnings.filterwarnings("ignore", message=".*trainer.*")
            return _loss_of(module.training_step(batch, 0))

    return Workload(name=name or type(probe).__name__, model=model, dataset=dataset, optimizer=optimizer, loss=loss,
                    batch_size=batch_size, collate_fn=collate_fn)
