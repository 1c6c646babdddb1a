"""Test doubles that imitate the measurement side, for testing the agent's decisions
without training: a config's true throughput is a function you give, plus seeded noise
and drift. `FakeRunner` is a real `Runner` whose handles are `FakeHandle`s, so the
window order of `measure` and `interleave` is the production code's own.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Callable

import torch

from .clock import STAGES
from .config import TrainConfig
from .errors import TrialFailed
from .measure import Protocol
from .record import Signals, StageTime, StepTime, Summary
from .runner import Runner
from .workload import Workload

__all__ = ["FakeHandle", "FakeRunner", "TrialFailed"]

DEFAULT_STAGES = {"data": 0.0, "forward": 0.45, "backward": 0.45, "optimizer": 0.1}
TAILS = ("gauss", "t", "burst")
# Heavy tails fitted to A/As measured on 2-core CPUs: pair log ratios had a kurtosis of
# 6.6-8.8 (a normal's is 3), from windows that a burst of the machine hits reading 20-50%
# slow (`autotune.stats.look_mean`). With 5% window noise,
# a burst in 7% of windows gives pairs a kurtosis of ~8 (and windows an sd of ~13%);
# a Student-t's pairs have kurtosis 3 + 3 / (df - 4): 8.0 at df 4.6 (but 80 of them read ~3.7).
BURST = (0.2, 0.5)  # how much slower a window that a burst hits reads
BURSTS = 0.07  # the share of windows a burst hits
DF = 4.6


def _dummy_workload(batch_size: int) -> Workload:
    return Workload(name="fake", model=lambda: torch.nn.Linear(2, 2), dataset=[0] * batch_size,
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.1), loss=lambda m, b: m.weight.sum(), batch_size=batch_size)


class FakeHandle:
    """One config's windows drawn from the runner's model of the machine."""

    def __init__(self, runner: FakeRunner, config: TrainConfig) -> None:
        self.runner, self.config, self.windows = runner, config, []
        self.level = 1 + runner.rng.gauss(0, runner.session) if runner.session else 1.0

    def window(self) -> float:
        v = self.runner.draw(self.config) * self.level
        self.windows.append(v)
        return v

    def profile(self, trace: str | None = None) -> None:
        return None

    def summary(self) -> Summary:
        r, thr = self.runner, self.windows or [self.runner.draw(self.config)]
        mean_thr = statistics.fmean(thr)
        step = r.workload.batch_size / mean_thr
        given = r.stages(self.config)
        names = STAGES + tuple(k for k in given if k not in STAGES)  # e.g. a DDP step's "communication"
        true = {s: given.get(s, 0.0) for s in names}
        per_window = [r.jitter(true, self.config) for _ in thr]  # each window's shares: the noise of its throughput
        shares = {s: statistics.fmean(w[s] for w in per_window) for s in names}
        losses = r.losses(self.config)
        return Summary(
            config=self.config.flat(), samples_per_s=mean_thr, windows_samples_per_s=list(thr),
            window_cv=statistics.pstdev(thr) / mean_thr if len(thr) > 1 else 0.0,
            step_time_s=StepTime(median=step, p90=step * 1.1, mean=step),
            stages={s: StageTime(s=step * v, share=v) for s, v in shares.items()},
            window_stage_shares=per_window,
            peak_memory_bytes=r.memory(self.config), peak_rss_bytes=10**8,
            one_time={"setup_s": 0.1, "first_step_s": 0.01},
            signals=Signals(**{"ops_per_step": 10, "mean_op_us": 500.0, "syncs_per_step": 0.0, "comm_share": 0.0,
                               **r.signals(self.config)}),
            measured_steps=10 * len(thr), first_losses=losses,
        )

    def close(self, kill: bool = False) -> None:
        return None


class FakeRunner(Runner):
    """Measures nothing: a window's throughput is `speed(config)` x drift x its session's
    offset x (1 + noise).

    Args:
        speed: True throughput of a config; may raise `TrialFailed` to imitate a crash.
        noise: Standard deviation of each window's relative error, or a function of the config
            giving it (a config whose windows vary more than the baseline's).
        tails: The window error's shape: "gauss" (1 + noise x a normal draw); "t" (exp of
            noise x a unit-variance Student-t with `df` degrees of freedom); "burst" (exp of
            noise x a normal draw, and a share `bursts` of windows hit by a burst that makes
            them `BURST` slower). The heavy ones are fitted to the measured kurtosis (`BURSTS`).
        df: The Student-t's degrees of freedom (`tails="t"`; more than 4).
        bursts: The share of windows a burst hits (`tails="burst"`).
        carry: The share of a window's time that still runs at the previous window's config's
            speed when that config differs (its prefetching workers, its caches).
        drift: Relative change of the machine's speed per window taken (any config), as
            when a machine warms up or a neighbour starts: windows taken in turns cancel it.
        session: Standard deviation of a session's relative offset: each measurement and
            each side of a comparison is its own process, placed and disturbed on its own,
            so its windows share an error that pairing inside one comparison cannot cancel.
        stages: Stage shares of a config's step.
        memory: Peak bytes of a config.
        losses: First losses of a config (default: the same for every config).
        signals: Profiler signals of a config beyond the defaults (e.g. `data_cpu_share`).
        lowp: What the low-precision probe reads (`autotune.probe`; default: not measured).
        handoff: What receiving one batch from a loader worker costs, s (`autotune.handoff`;
            default: not measured).

    Counts every config given to `measure` in `measured` and every `interleave` call in
    `interleaved` (pairs of flat configs).
    """

    def __init__(self, speed: Callable[[TrainConfig], float], *, noise: float | Callable[[TrainConfig], float] = 0.02,
                 seed: int = 0, drift: float = 0.0,
                 stages: Callable[[TrainConfig], dict[str, float]] | None = None,
                 memory: Callable[[TrainConfig], int] | None = None,
                 losses: Callable[[TrainConfig], list[float]] | None = None,
                 signals: Callable[[TrainConfig], dict] | None = None, batch_size: int = 32,
                 protocol: Protocol | None = None, lowp: dict[str, float] | None = None,
                 session: float = 0.0, handoff: float | None = None, tails: str = "gauss", df: float = DF,
                 bursts: float = BURSTS, carry: float = 0.0) -> None:
        super().__init__(_dummy_workload(batch_size), "fake.py", torch.device("cpu"), protocol or Protocol(windows=4),
                         isolate=False)
        if tails not in TAILS or (tails == "t" and df <= 4) or not 0 <= carry < 1:
            raise ValueError(f"tails {tails!r} (one of {TAILS}), df {df} (> 4 for a finite kurtosis) or carry {carry} "
                             "(from 0 to below 1) is out of range")
        self.speed, self.noise, self.drift, self.rng = speed, noise, drift, random.Random(seed)
        self.session, self.tails, self.df, self.bursts, self.carry = session, tails, df, bursts, carry
        self.previous: tuple[dict, float] | None = None  # the last window's config and true speed (`carry`)
        self.stages = stages or (lambda c: DEFAULT_STAGES)
        self.memory = memory or (lambda c: 1000)
        self.losses = losses or (lambda c: [1.0, 0.9])
        self.signals = signals or (lambda c: {})
        self.lowp = lowp or {}
        self.handoff = handoff
        self.windows_taken = 0
        self.measured: list[dict] = []
        self.interleaved: list[tuple[dict, dict]] = []

    def sd(self, config: TrainConfig | None = None) -> float:
        """The relative window noise of `config` (of the default config when not given)."""
        return self.noise(config or TrainConfig()) if callable(self.noise) else self.noise

    def error(self, sd: float) -> float:
        """One window's relative error factor under `tails`."""
        if self.tails == "gauss":
            return 1 + self.rng.gauss(0, sd)
        if self.tails == "t":
            z = self.rng.gauss(0, 1) / math.sqrt(self.rng.gammavariate(self.df / 2, 2) / self.df)
            return math.exp(sd * z * math.sqrt((self.df - 2) / self.df))
        hit = math.log(1 - self.rng.uniform(*BURST)) if self.rng.random() < self.bursts else 0.0
        return math.exp(self.rng.gauss(0, sd) + hit)

    def draw(self, config: TrainConfig) -> float:
        level = (1 + self.drift) ** self.windows_taken
        self.windows_taken += 1
        true = self.speed(config)
        if self.carry:
            flat, last = config.flat(), self.previous
            self.previous = (flat, true)
            if last is not None and last[0] != flat and true > 0 and last[1] > 0:  # part of it at the previous speed
                true = 1 / ((1 - self.carry) / true + self.carry / last[1])
        return true * level * self.error(self.sd(config))

    def jitter(self, shares: dict[str, float], config: TrainConfig | None = None) -> dict[str, float]:
        """Stage shares as one window would measure them: each off by the runner's noise."""
        sd = self.sd(config)
        noisy = {k: max(0.0, v * (1 + self.rng.gauss(0, sd))) for k, v in shares.items()}
        total = sum(noisy.values()) or 1.0
        return {k: v / total for k, v in noisy.items()}

    def lowp_matmul(self) -> dict[str, float]:
        return dict(self.lowp)

    def batch_handoff(self) -> float | None:
        return self.handoff

    def open(self, config: TrainConfig, trials: float = 1.0) -> FakeHandle:
        return FakeHandle(self, config)

    def measure(self, config: TrainConfig, trace: str | None = None, on_window=None, floor=None,
                until=None) -> Summary:
        self.measured.append(config.flat())
        return super().measure(config, trace, on_window, floor, until)

    def interleave(self, a: TrainConfig, b: TrainConfig, pairs: int, on_pair=None) -> tuple[list[float], list[float]]:
        self.interleaved.append((a.flat(), b.flat()))
        return super().interleave(a, b, pairs, on_pair)
