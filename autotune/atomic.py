"""Files autotune writes: atomically (a crash never leaves a half-written report or
config), and only where the user's flags point at a writable place."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import UserError


def write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as an ordinary file would be, not mkstemp's owner-only
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def writable_file(path: str, flag: str) -> Path:
    """`path` for a file a flag names, once its folder exists and can be written."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(p.parent, os.W_OK):
            raise PermissionError
    except (OSError, PermissionError):
        raise UserError(f"{flag} {path!r}: cannot write there; give a path in a writable folder.") from None
    return p


def output_folder(path: str, flag: str = "--out") -> Path:
    """The output folder, created, once a file can really be written into it."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".autotune-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"{flag} {path!r} is not a writable folder ({exc.strerror}); give a folder you can write to.") from None
    return out
