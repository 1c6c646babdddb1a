"""Build an `autotune.Workload` from another framework's own objects.

`autotune.integrations.lightning.workload(...)` takes a `LightningModule` factory;
`autotune.integrations.hf.workload(...)` takes what `transformers.Trainer` takes
(`model_init`, `train_dataset`, `data_collator`, `TrainingArguments`). Each imports its
framework only when called, and says what to install when it is missing.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from autotune.errors import UserError


def require(module: str, extra: str, what: str) -> ModuleType:
    """`import module`, or a `UserError` naming the package and the autotune extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UserError(f"{what} needs the {module!r} package, which cannot be imported here ({exc}); "
                        f"install it with `pip install 'autotune[{extra}]'` (CPU: keep your torch).") from None
