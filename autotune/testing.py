"""Test doubles that imitate `autotune.runner.Runner`, for testing the agent's decisions
without training: a config's true throughput is a function you give, plus seeded noise."""

from __future__ import annotations

import random
from typing import Any, Callable

import torch

from .clock import STAGES
from .config import TrainConfig
from .measure import Protocol
from .runner import TrialFailed
from .workload import Workload


def _dummy_workload(batch_size: int) -> Workload:
    return Workload(name="fake", model=lambda: torch.nn.Linear(2, 2), dataset=[0] * batch_size,
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.1), loss=lambda m, b: m.weight.sum(), batch_size=batch_size)


class FakeRunner:
    """Measures nothing: throughput = `speed(config)` x (1 + noise), stages from `stages(config)`.

    `speed` may raise `TrialFailed` to imitate a crash; `memory(config)` gives peak bytes.
    Counts every config it was asked to measure in `measured`.
    """

    def __init__(self, speed: Callable[[TrainConfig], float], *, noise: float = 0.02, seed: int = 0,
                 stages: Callable[[TrainConfig], dict[str, float]] | None = None,
                 memory: Callable[[TrainConfig], int] | None = None, batch_size: int = 32,
                 protocol: Protocol | None = None) -> None:
        self.speed, self.noise, self.rng = speed, noise, random.Random(seed)
        self.stages = stages or (lambda c: {"data": 0.0, "forward": 0.5, "backward": 0.5})
        self.memory = memory or (lambda c: 1000)
        self.workload = _dummy_workload(batch_size)
        self.target, self.device = "fake.py", torch.device("cpu")
        self.protocol = protocol or Protocol(windows=4)
        self.measured: list[dict[str, Any]] = []

    def _window(self, config: TrainConfig) -> float:
        return self.speed(config) * (1 + self.rng.gauss(0, self.noise))

    def measure(self, config: TrainConfig, trace: str | None = None, on_window=None) -> dict[str, Any]:
        self.measured.append(config.flat())
        thr = [self._window(config) for _ in range(self.protocol.windows)]
        mean_thr = sum(thr) / len(thr)
        step = self.workload.batch_size / mean_thr
        shares = {s: self.stages(config).get(s, 0.0) for s in STAGES}
        total = sum(shares.values()) or 1.0
        return {
            "config": config.flat(), "samples_per_s": mean_thr, "windows_samples_per_s": thr, "window_cv": self.noise,
            "step_time_s": {"median": step, "p90": step * 1.1, "mean": step},
            "stages": {s: {"s": step * v / total, "share": v / total} for s, v in shares.items()},
            "peak_memory_bytes": self.memory(config), "peak_rss_bytes": 10**8,
            "one_time": {"setup_s": 0.1, "first_step_s": 0.01}, "signals": {"ops_per_step": 10, "mean_op_us": 500.0,
                                                                           "syncs_per_step": 0.0, "comm_share": 0.0},
            "measured_steps": 10, "first_losses": [1.0, 0.9], "wall_s": 0.0,
        }

    def interleave(self, a: TrainConfig, b: TrainConfig, pairs: int, on_pair=None) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for _ in range(pairs):
            xs.append(self._window(a)), ys.append(self._window(b))
        return xs, ys


__all__ = ["FakeRunner", "TrialFailed"]
