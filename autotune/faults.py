"""A test hook for fault injection: stop a run at a named point, deterministically.

With `AUTOTUNE_PAUSE_AT=<point>` (or `<point>@<n>`: the n-th time any process of the run
reaches it) set, the process that reaches it writes its pid to `AUTOTUNE_PAUSE_FILE` and
waits there until a signal ends or interrupts it, so a test kills or signals the run at a
known place instead of polling and hoping. Points: `baseline`, `compare` (the A/A and
every side-by-side comparison), `trial` (before each search trial is measured), `window`
(each measured window, in whichever process measures: a trial's worker too), `report`
(before the reports are written). Unset, it does nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["POINTS", "checkpoint"]

POINTS = ("baseline", "compare", "trial", "window", "report")


def checkpoint(point: str) -> None:
    want = os.environ.get("AUTOTUNE_PAUSE_AT")
    if not want or want.partition("@")[0] != point:
        return
    marker = os.environ.get("AUTOTUNE_PAUSE_FILE")
    nth = want.partition("@")[2]
    if nth and marker:
        with open(marker + ".count", "a") as f:  # one line per arrival, from any process of the run
            f.write(f"{os.getpid()}\n")
        if len(Path(marker + ".count").read_text().splitlines()) != int(nth):
            return
    if marker:
        Path(marker).write_text(str(os.getpid()))
    while True:  # until a signal's handler raises, or the process is killed
        time.sleep(3600)
