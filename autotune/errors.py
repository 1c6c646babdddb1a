"""Errors a user can cause, kept apart from autotune's own failures.

`UserError` is a mistake in the input (a path, a flag, a config): the CLI prints its
message as one paragraph and exits with code 2. `UserCodeError` wraps an exception raised
inside the user's own workload code: the CLI shows their traceback, trimmed to their frames.
"""

from __future__ import annotations

import importlib
import traceback
from pathlib import Path

from .record import FailureKind

_OUR_ROOT = str(Path(__file__).resolve().parent)
_IMPORTLIB = str(Path(importlib.__file__).resolve().parent)  # the import machinery's frames are noise too


def _theirs(filename: str) -> bool:
    """Whether a frame's file is the user's (not autotune, torch or the import machinery)."""
    return not (filename.startswith((_OUR_ROOT, _IMPORTLIB, "<frozen importlib")) or "/torch/" in filename)


class UserError(Exception):
    """Bad input: the message names the input, what was wrong, and what to do instead."""


class ConfigError(UserError):
    """A TrainConfig that cannot be built or cannot be applied to this workload/device."""

    def __init__(self, errors: list[str], source: str = "config") -> None:
        self.errors = list(errors)
        self.source = source
        lines = "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(f"{source} is invalid ({len(self.errors)} error(s)):\n{lines}")


class UserCodeError(Exception):
    """An exception raised inside the user's workload code (model, dataset, loss, ...)."""

    def __init__(self, where: str, exc: BaseException) -> None:
        self.where = where
        self.exc = exc
        super().__init__(f"{where} raised {type(exc).__name__}: {exc}")

    def user_traceback(self) -> str:
        """The traceback of the original exception, with autotune's, torch's and the import
        machinery's frames dropped."""
        frames = [f for f in traceback.extract_tb(self.exc.__traceback__) if _theirs(f.filename)]
        text = "".join(traceback.format_list(frames))
        tail = "".join(traceback.format_exception_only(type(self.exc), self.exc))
        return f"Traceback (your code, autotune and torch frames omitted):\n{text}{tail}"


def call_user(where: str, fn, *args, **kwargs):
    """Call user code; anything it raises becomes a `UserCodeError` naming `where`."""
    try:
        return fn(*args, **kwargs)
    except (UserError, UserCodeError, KeyboardInterrupt):
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure in user code is theirs to see
        # SystemExit too: a module that calls sys.exit() or parses the command line at import
        # time must not end autotune silently with its own exit code.
        raise UserCodeError(where, exc) from exc


class TrialFailed(Exception):
    """A measurement that could not finish, with its `FailureKind`, reason and detail."""

    def __init__(self, kind: FailureKind | str, reason: str, detail: str = "") -> None:
        self.kind, self.reason, self.detail = FailureKind(kind), reason, detail
        super().__init__(f"{self.kind.value}: {reason}")


class TrialCut(Exception):
    """A measurement stopped after some of its windows: even its fastest window read below
    `floor` (samples/s), so the rest could not make it a candidate; or (`floor` None) the
    time it had was spent."""

    def __init__(self, windows: list[float], floor: float | None, of: int) -> None:
        self.windows, self.floor, self.of = list(windows), floor, of
        why = f"{max(self.windows):.1f} samples/s at best, below {floor:.1f}" if floor is not None else \
            "the run's time budget was spent"
        super().__init__(f"stopped after {len(self.windows)} of {of} windows: {why}")


EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def explain(exc: UserError | UserCodeError | KeyboardInterrupt, whose: str = "your workload code") -> str:
    """What a command prints on stderr when `exc` ends it: one paragraph, and for an error
    in the user's code their traceback (autotune's frames left out) before it."""
    if isinstance(exc, UserCodeError):
        return f"{exc.user_traceback()}\nerror: {exc} (this is an error in {whose}, see the traceback above)"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return f"error: {exc}"


def exit_code(exc: BaseException) -> int:
    """The process exit code for an exception that ends a command (CLI and benchmarks alike):
    2 for bad input or an error in the user's code, 130 for Ctrl-C, 1 for anything else."""
    if isinstance(exc, (UserError, UserCodeError)):
        return EXIT_BAD_INPUT
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_FAILURE
