"""The command line's flags checked before anything is imported or measured: bounds past
which a value is a typo, text that must be usable, and output paths that must be writable."""

from __future__ import annotations

import argparse
from pathlib import Path

from .errors import UserError

# Flag bounds, checked before anything is imported or measured: past them a run is a typo
# (a seed torch and NumPy cannot take, a protocol that would never end).
SEED_LIMIT = 2**32
PROTOCOL_BOUNDS = {"windows": (2, 1000), "steps": (1, 100_000), "warmup": (0, 100_000)}
MAX_TRIALS = 100_000
MAX_NAME = 512  # Optuna's RDB storages index study names up to 512 characters
_REPORT_FILES = ("tuned.yaml", "report.json", "report.md", "report.html")


_EMPTY_HINT = {
    "the target": "give file.py, file.py:func or package.module:func",
    "the folder": "give the --out folder of an `autotune tune` run",
}


def text(value: str | None, flag: str) -> None:
    """A text flag must be non-empty and valid Unicode (a file name that is not UTF-8 would
    fail only when the report is written, after every measurement)."""
    if value is None:
        return
    if not str(value).strip():
        hint = _EMPTY_HINT.get(flag, "give a value, or leave the flag out for its default")
        raise UserError(f"{flag} is empty; {hint}.")
    try:
        str(value).encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{flag} {value!r} is not valid UTF-8 text; rename the file or folder, "
                        "or give a path with valid UTF-8 characters.") from None


def bounded(value: int | None, flag: str, low: int, high: int, why: str = "") -> None:
    if value is not None and not low <= value <= high:
        raise UserError(f"{flag} {value} is out of range; give a whole number from {low} to {high}{why}.")


def check(args: argparse.Namespace) -> None:
    """Every flag a command has, checked before anything is imported or measured."""
    for flag in ("target", "out", "json", "trace", "config", "recipes", "storage", "study", "dir"):
        text(getattr(args, flag, None), {"target": "the target", "dir": "the folder"}.get(flag, f"--{flag}"))
    if hasattr(args, "seed"):
        bounded(args.seed, "--seed", 0, SEED_LIMIT - 1, " (torch and NumPy take seeds >= 0 and < 2**32)")
    if hasattr(args, "windows"):
        for flag, (low, high) in PROTOCOL_BOUNDS.items():
            why = ", so the spread between windows can be measured" if flag == "windows" else ""
            bounded(getattr(args, flag), f"--{flag}", low, high, why)
    elif getattr(args, "steps", None) is not None:  # train: optimizer steps
        if args.steps < 1:
            raise UserError(f"--steps {args.steps}: give a positive number of steps.")
    if hasattr(args, "trials"):
        if args.trials < 1:
            raise UserError(f"--trials {args.trials}: give a positive number of trials.")
        bounded(args.trials, "--trials", 1, MAX_TRIALS)
    if getattr(args, "study", None) is not None and len(args.study) > MAX_NAME:
        raise UserError(f"--study is {len(args.study)} characters long; give a study name of at most {MAX_NAME}.")


def output_file(path: str, flag: str, taken: dict[Path, str]) -> Path:
    """The file `flag` names, once it is known that it can be written (before measuring)."""
    import os
    import tempfile

    from .atomic import writable_file

    p = writable_file(path, flag)
    if p.is_dir():
        raise UserError(f"{flag} {path!r} is a folder; give the path of a file to write (like {path.rstrip('/')}/out.json).")
    if p.exists() and not p.is_file():  # the atomic write would replace a device or pipe (/dev/null!) with a file
        raise UserError(f"{flag} {path!r} is not a regular file (a device, pipe or socket); "
                        "give the path of a regular file to write.")
    try:  # the file is written through a temporary file beside it: that must be possible
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise UserError(f"{flag} {path!r}: cannot write in {str(p.parent)!r} ({exc.strerror}); "
                        "give a path in a writable folder.") from None
    key = p.resolve()
    if key in taken:
        raise UserError(f"{flag} {path!r} is the same file as {taken[key]}; give each output its own file.")
    taken[key] = flag
    return p


def output_dir(path: str) -> Path:
    """The --out folder, writable, with no folder where a report file goes."""
    from .atomic import output_folder

    out = output_folder(path)
    for name in _REPORT_FILES:
        if (out / name).is_dir():
            raise UserError(f"--out {path!r} holds a folder named {name}, where autotune writes that file; "
                            "move it away or give another --out folder.")
    return out
