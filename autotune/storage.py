"""Where trials and decisions are stored: Optuna storage URLs, opened with clear errors,
shown without passwords, and the study name a workload gets by default."""

from __future__ import annotations

import re
from pathlib import Path

import optuna

from .errors import UserError

__all__ = ["default_url", "open_storage", "redact", "study_name"]


def default_url(out_dir: Path) -> str:
    """A SQLite file in the output folder."""
    return f"sqlite:///{(Path(out_dir) / 'study.db').resolve()}"


def redact(url: str) -> str:
    """The URL with any password hidden, for messages and reports."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a SQLAlchemy URL: hide anything that looks like a password
        return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    try:
        return optuna.storages.get_storage(url)
    except Exception as exc:  # noqa: BLE001 - any failure to open storage is the URL's
        msg = str(exc).replace(url, redact(url))
        raise UserError(
            f"--storage {redact(url)!r} cannot be opened ({type(exc).__name__}: {msg.splitlines()[0][:300]}); "
            "give an Optuna storage URL such as sqlite:///path/study.db or postgresql://user:pass@host/db."
        ) from None


def study_name(workload_name: str) -> str:
    """A study name derived from the workload's name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", workload_name).strip("-") or "workload"
