"""Stage clocks: mark stage boundaries inside a step without synchronising.

`HostClock` reads `perf_counter` (CPU work is synchronous, so host time is the stage's
time). `CudaClock` records CUDA events at the boundaries and reads them only after the
window, when the caller has synchronised once; the data wait is timed on the host.
Both turn a window's marks into per-step stage times that sum to the step time.
"""

from __future__ import annotations

import time

import torch

STAGES = ("data", "h2d", "forward", "backward", "optimizer", "other")
DEVICE_STAGES = ("h2d", "forward", "backward", "optimizer")


class HostClock:
    def __init__(self) -> None:
        self.steps: list[list[tuple[str, float]]] = []

    def start_step(self) -> None:
        self.steps.append([("start", time.perf_counter())])

    def mark(self, stage: str) -> None:
        self.steps[-1].append((stage, time.perf_counter()))

    def end_window(self) -> float:
        """Marks the end of the last step; returns the host time."""
        self._end = time.perf_counter()
        return self._end

    def resolve(self) -> list[dict[str, float]]:
        """Per step: seconds per stage, `other` being the rest, and `step` the total."""
        out = []
        for i, marks in enumerate(self.steps):
            end = self.steps[i + 1][0][1] if i + 1 < len(self.steps) else self._end
            stages = dict.fromkeys(STAGES, 0.0)
            for (_, t0), (stage, t1) in zip(marks, marks[1:]):
                stages[stage] += t1 - t0
            step = end - marks[0][1]
            stages["other"] = max(0.0, step - sum(v for k, v in stages.items() if k != "other"))
            stages["step"] = step
            out.append(stages)
        return out


class CudaClock:
    """Host wait for data on the host; device stages from CUDA events read after the window."""

    def __init__(self) -> None:
        self.steps: list[dict] = []

    def _event(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def start_step(self) -> None:
        self.steps.append({"t0": time.perf_counter(), "marks": []})

    def mark(self, stage: str) -> None:
        step = self.steps[-1]
        if stage == "data":
            step["data"] = time.perf_counter() - step["t0"]
            step["marks"].append(("start", self._event()))
        else:
            step["marks"].append((stage, self._event()))

    def end_window(self) -> float:
        self._end_event = self._event()
        torch.cuda.synchronize()
        return time.perf_counter()

    def resolve(self) -> list[dict[str, float]]:
        out = []
        for i, step in enumerate(self.steps):
            marks = step["marks"]
            nxt = self.steps[i + 1]["marks"][0][1] if i + 1 < len(self.steps) else self._end_event
            stages = dict.fromkeys(STAGES, 0.0)
            for (_, e0), (stage, e1) in zip(marks, marks[1:]):
                stages[stage] += e0.elapsed_time(e1) / 1e3
            step_s = marks[0][1].elapsed_time(nxt) / 1e3
            idle = max(0.0, step_s - sum(stages[s] for s in DEVICE_STAGES))
            # The gap to the next step's start holds the host's wait for the next batch;
            # it costs only where the device sat idle meanwhile.
            wait = self.steps[i + 1].get("data", 0.0) if i + 1 < len(self.steps) else 0.0
            stages["data"] = min(wait, idle)
            stages["other"] = idle - stages["data"]
            stages["step"] = step_s
            out.append(stages)
        return out


def clock_for(device: torch.device):
    return CudaClock() if device.type == "cuda" else HostClock()
