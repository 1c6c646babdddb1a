"""What makes two runs' measurements comparable, and the study a run resumes.

A run's fingerprint holds everything its stored measurements depend on: the target, the
workload's name and batch size, the protocol, the device and its model, the cores it may
use, the memory limit, the recipes (names and content) and the autotune and torch
versions. Same fingerprint: the run resumes its study. A different one: the run takes a
study of its own (named after the fingerprint), or with `--resume strict` it refuses and
names what changed; `--resume new` always starts afresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from enum import Enum
from pathlib import Path
from typing import Any

import optuna

from . import machine
from .errors import UserError
from .recipes import Recipe
from .runner import TrialRunner
from .version import __version__

__all__ = ["Resume", "choose_study", "differences", "fingerprint", "fingerprint_id"]


class Resume(str, Enum):
    AUTO = "auto"
    STRICT = "strict"
    NEW = "new"


def _target(target: str | None) -> str | None:
    if not target:
        return target
    path, sep, func = target.rpartition(":") if ":" in target else (target, "", "")
    return str(Path(path).resolve()) + sep + func if path.endswith(".py") else target


def fingerprint(runner: TrialRunner, recipes: list[Recipe], memory_limit: int | None) -> dict[str, Any]:
    """The facts a stored measurement depends on, as plain JSON values."""
    import torch

    m = machine.describe(runner.device)
    return {
        "target": _target(runner.target), "workload": runner.workload.name, "batch_size": runner.workload.batch_size,
        "protocol": dataclasses.asdict(runner.protocol), "device": runner.device.type, "gpu": m.gpu,
        "cpu": m.cpu, "cores": m.cores, "memory_limit_bytes": memory_limit,
        "recipes": {r.name: hashlib.sha256(repr(r).encode()).hexdigest()[:12] for r in recipes},
        "autotune": __version__, "torch": torch.__version__,
    }


def fingerprint_id(fp: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:10]


def differences(stored: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """`key: was -> now` for every fact that changed."""
    out = []
    for key in sorted(set(stored) | set(now)):
        if stored.get(key) != now.get(key):
            was, new = stored.get(key), now.get(key)
            if isinstance(was, dict) and isinstance(new, dict):
                changed = sorted(k for k in set(was) | set(new) if was.get(k) != new.get(k))
                out.append(f"{key} ({', '.join(changed)})")
            else:
                out.append(f"{key}: {was!r} -> {new!r}")
    return out


def _stored(storage: Any, name: str) -> dict[str, Any] | None:
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None
    return study.user_attrs.get("fingerprint", {})


def choose_study(storage: Any, name: str, fp: dict[str, Any], mode: Resume) -> tuple[str, str | None]:
    """The study this run uses, and a note when it is not `name` itself."""
    fid = fingerprint_id(fp)
    if mode is Resume.NEW:
        fresh = f"{name}-{fid}-{time.strftime('%Y%m%d-%H%M%S')}"
        return fresh, f"--resume new: a fresh study {fresh!r}"
    stored = _stored(storage, name)
    if stored is None or stored == fp:
        return name, None
    changed = differences(stored, fp) if stored else ["the study has no fingerprint (made by an older autotune)"]
    what = "; ".join(changed)
    if mode is Resume.STRICT:
        raise UserError(f"--resume strict: study {name!r} was measured under other conditions ({what}); its "
                        "measurements cannot be compared with this run's. Rerun as before, use --resume auto "
                        "(a study of its own) or another --study.")
    own = f"{name}-{fid}"
    return own, f"study {name!r} was measured under other conditions ({what}): using study {own!r}"
