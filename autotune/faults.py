"""A test hook for fault injection: stop a run at a named point, deterministically.

With `AUTOTUNE_PAUSE_AT=<point>` set, the run writes its pid to `AUTOTUNE_PAUSE_FILE`
when it reaches that point and waits there until a signal ends or interrupts it, so a
test kills or signals it at a known place instead of polling and hoping. Points:
`baseline`, `compare` (the A/A and every side-by-side comparison), `trial` (before each
search trial is measured), `report` (before the reports are written). Unset, it does
nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["POINTS", "checkpoint"]

POINTS = ("baseline", "compare", "trial", "report")


def checkpoint(point: str) -> None:
    if os.environ.get("AUTOTUNE_PAUSE_AT") != point:
        return
    marker = os.environ.get("AUTOTUNE_PAUSE_FILE")
    if marker:
        Path(marker).write_text(str(os.getpid()))
    while True:  # until a signal's handler raises, or the process is killed
        time.sleep(3600)
