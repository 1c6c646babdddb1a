"""One run per output folder and per study at a time.

The folder lock is an exclusive `flock` on `DIR/.autotune.lock`, which the kernel releases
when the process dies however it dies. A study in shared storage (another machine may
point at the same database) carries a lease in its user attributes: who holds it and when
it was last renewed; a run refuses a lease that is alive, and takes over one whose holder
is gone (same host, dead pid) or that was not renewed within its time to live. The lease is
what cooperating workers on one study can later share.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import optuna

from .errors import UserError

__all__ = ["FolderLock", "Lease"]


def _me() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FolderLock:
    """`with FolderLock(out):` holds the output folder for this process."""

    def __init__(self, folder: Path, flag: str = "--out") -> None:
        self.path, self.flag, self.file = Path(folder) / ".autotune.lock", flag, None

    def __enter__(self) -> FolderLock:
        f = open(self.path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise UserError(f"{self.flag} {str(self.path.parent)!r} is in use by another autotune run ({holder}); "
                            "two runs measuring at once on the same cores corrupt both measurements: wait for it "
                            f"to finish, or give another {self.flag}.") from None
        f.seek(0)
        f.truncate()
        me = _me()
        f.write(f"pid {me['pid']} on {me['host']}")
        f.flush()
        self.file = f
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.truncate(0)
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None


class Lease:
    """A study's lease: `take()` at the start, `renew()` as the run goes, `release()` at the end."""

    KEY = "lease"

    def __init__(self, study: optuna.Study, ttl_s: float) -> None:
        self.study, self.ttl_s = study, ttl_s

    def take(self) -> None:
        held = self.study.user_attrs.get(self.KEY)
        if held:
            holder = json.loads(held) if isinstance(held, str) else held
            me = _me()
            same_host = holder.get("host") == me["host"]
            # On this host the process table is the truth; elsewhere, a lease not renewed in time.
            pid = int(holder.get("pid") or 0)
            gone = (pid <= 0 or not _alive(pid)) if same_host else \
                time.time() - float(holder.get("renewed", 0)) > self.ttl_s
            if not gone and not (same_host and holder.get("pid") == me["pid"]):
                raise UserError(
                    f"study {self.study.study_name!r} is in use by another autotune run (pid {holder.get('pid')} on "
                    f"{holder.get('host')}); wait for it to finish, or give another --study.")
        self.renew()

    def renew(self) -> None:
        self.study.set_user_attr(self.KEY, {**_me(), "renewed": time.time()})

    def release(self) -> None:
        """Give the lease back, unless another run has taken it over since."""
        held = self.study.user_attrs.get(self.KEY) or {}
        me = _me()
        if not held or (held.get("host"), held.get("pid")) == (me["host"], me["pid"]):
            self.study.set_user_attr(self.KEY, None)
