"""Signals that end a run (SIGTERM from a scheduler or `timeout`, SIGHUP from a dropped
SSH session) become an exception, so the same path that handles Ctrl-C writes the report
and kills the workers."""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

__all__ = ["Stopped", "stop_on_signals"]


class Stopped(BaseException):
    """The process was asked to stop by a signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def stop_on_signals(*signums: int) -> Iterator[None]:
    """While inside, each of `signums` (default SIGTERM and SIGHUP) raises `Stopped`."""
    signums = signums or (signal.SIGTERM, signal.SIGHUP)

    def handler(signum, frame):
        for s in signums:  # a repeated signal (schedulers send several) must not cut the report short
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    before = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)
