"""The compared methods, each measuring through one `Runner` under the suite's protocol.

- `run_single`: one config (the rule of thumb).
- `search_stored`: Optuna's TPE or random sampler over the grid's knobs, no diagnosis, a
  given trial budget, looking each config up in the stored grid (`grids`).
- `run_agent`: autotune's `Agent`, with its diagnosis, on in-memory Optuna storage.
- `judge`: the configs the methods chose, re-measured alike in blocks of fresh sessions,
  in turns (the order reversed every round) so that drift of the machine hits them alike;
  a method's figure is this fresh measurement, not the best of its own noisy search. Where
  it also picks the grid's best among a few, it picks on blocks of their own.

A config over the memory limit, out of memory, crashed, or with a diverged loss counts as
throughput 0 everywhere (the same `Constraints` the agent applies).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import optuna

from autotune.agent import Agent, Settings
from autotune.config import TrainConfig
from autotune.errors import ConfigError, TrialFailed
from autotune.recipes import Recipe
from autotune.record import Comparison, Report, Trial
from autotune.runner import Runner
from autotune.search import Constraints, normalized, quiet_optuna
from autotune.stats import looks_ratio, paired_ratio

Log = Callable[[str], None]


def _key(config: TrainConfig) -> tuple:
    return tuple(sorted(config.flat().items(), key=lambda kv: kv[0]))


class _CountedHandle:
    """A handle whose windows its runner's `Metered` counts."""

    def __init__(self, handle: Any, meter: Metered) -> None:
        self.handle, self.meter = handle, meter

    def window(self) -> float:
        thr = self.handle.window()
        self.meter.windows += 1
        return thr

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


class Metered:
    """A runner mixin (`class R(Metered, Runner)`) that counts every window and session its
    handles measure: `measure`, `interleave` and direct `open` alike (baseline, A/As, trials,
    comparisons, duels). `reset` before a method, `count` after it."""

    windows = sessions = measurements = pairs = 0

    def reset(self) -> None:
        self.windows = self.sessions = self.measurements = self.pairs = 0

    def open(self, config: TrainConfig, trials: float = 1.0) -> Any:
        handle = super().open(config, trials)  # type: ignore[misc]
        self.sessions += 1
        return _CountedHandle(handle, self)

    def measure(self, config: TrainConfig, *args: Any, **kwargs: Any) -> Any:
        self.measurements += 1
        return super().measure(config, *args, **kwargs)  # type: ignore[misc]

    def interleave(self, a: TrainConfig, b: TrainConfig, pairs: int, *args: Any, **kwargs: Any) -> Any:
        self.pairs += pairs
        return super().interleave(a, b, pairs, *args, **kwargs)  # type: ignore[misc]

    def count(self) -> dict[str, int]:
        return {"windows": self.windows, "sessions": self.sessions, "measurements": self.measurements,
                "interleaved_pairs": self.pairs}


def measure_one(runner: Runner, config: TrainConfig, constraints: Constraints | None) -> dict[str, Any]:
    """One config under the protocol: its throughput (0 when infeasible) and why."""
    t0 = time.perf_counter()
    try:
        s = runner.measure(config)
    except TrialFailed as exc:
        return {"config": config.flat(), "changes": TrainConfig().diff(config), "samples_per_s": 0.0,
                "measured_samples_per_s": None, "feasible": False, "reason": f"{exc.kind.value}: {exc.reason}",
                "wall_s": time.perf_counter() - t0, "peak_memory_bytes": None, "first_losses": []}
    problem = constraints.check(s) if constraints else None
    return {"config": config.flat(), "changes": TrainConfig().diff(config),
            "samples_per_s": 0.0 if problem else s.samples_per_s, "measured_samples_per_s": s.samples_per_s,
            "window_cv": s.window_cv, "feasible": problem is None, "reason": problem,
            "wall_s": time.perf_counter() - t0, "peak_memory_bytes": s.peak_memory_bytes,
            "first_losses": s.first_losses}


def run_single(runner: Runner, config: TrainConfig, constraints: Constraints) -> dict[str, Any]:
    row = measure_one(runner, config, constraints)
    return {"trials": 1, "wall_s": row["wall_s"], "config": row["config"], "samples_per_s": row["samples_per_s"],
            "feasible": row["feasible"], "reason": row["reason"], "peak_memory_bytes": row["peak_memory_bytes"]}


SAMPLERS = {"blind_tpe": lambda seed: optuna.samplers.TPESampler(seed=seed, n_startup_trials=4),
            "random": lambda seed: optuna.samplers.RandomSampler(seed=seed)}


def search_stored(stored: dict[str, Any], sampler: str, n_trials: int, seed: int, log: Log) -> dict[str, Any]:
    """A blind search (`SAMPLERS`: TPE or random) over the grid's knobs, the default
    enqueued first (as the agent does), that looks each suggested config up in the stored
    grid instead of measuring it: a trial's figure, windows and wall time are the stored
    ones. A config suggested again (also after normalisation) reuses its figure, still
    counts as a trial and costs no windows or time."""
    from benchmarks.grids import key

    rows = {key(r["config"]): r for r in stored["rows"]}
    grid = stored["grid"]
    with quiet_optuna():  # Optuna's INFO line per trial off, as in the agent's searches
        study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction="maximize",
                                    sampler=SAMPLERS[sampler](seed))
    default = TrainConfig()
    study.enqueue_trial({k: default.get(k) if default.get(k) in v else v[0] for k, v in grid.items()})
    seen: set[str] = set()
    trace: list[dict[str, Any]] = []
    wall, windows = 0.0, 0

    def objective(trial: optuna.Trial) -> float:
        nonlocal wall, windows
        params = {k: trial.suggest_categorical(k, v) for k, v in grid.items()}
        try:
            k = key(normalized(TrainConfig(), params))
        except ConfigError:
            k = None
        row = rows.get(k) if k else None
        if row is not None and k not in seen:
            wall += row["wall_s"]
            windows += len(row.get("windows_samples_per_s") or [])
        value = row["samples_per_s"] if row else 0.0
        trace.append({"config": row["config"] if row else None, "samples_per_s": value, "wall_s": wall,
                      "reused": k in seen, "in_grid": row is not None})
        if k:
            seen.add(k)
        return value

    with quiet_optuna():
        study.optimize(objective, n_trials=max(1, n_trials), catch=())
    best = max(range(len(trace)), key=lambda i: trace[i]["samples_per_s"])
    log(f"  {sampler}: {len(trace)} trials over the stored grid, best {trace[best]['samples_per_s']:.0f} samples/s")
    return {"trials": len(trace), "measured": len(seen), "windows": windows, "wall_s": wall, "trace": trace,
            "best_config": trace[best]["config"] or default.flat(), "samples_per_s": trace[best]["samples_per_s"]}


class LogEvents:
    """The agent's events (an `autotune.events.Listener`) as progress lines (rounds and
    decisions), and each trial with the time it finished (`timeline`, s since creation)."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.t0 = time.perf_counter()
        self.timeline: list[dict[str, Any]] = []

    def phase(self, name: str) -> None:
        return None

    def recipe(self, round_no: int, recipe: str, trials: int) -> None:
        self.log(f"  autotune round {round_no}: {recipe} ({trials} trials)")

    def trial(self, trial: Trial) -> None:
        self.timeline.append({"wall_s": time.perf_counter() - self.t0, "config": trial.config,
                              "samples_per_s": trial.samples_per_s or 0.0, "state": trial.state.value})

    def decision(self, recipe: str, accepted: bool, reason: str) -> None:
        self.log(f"  autotune {recipe}: {'accepted' if accepted else 'rejected'}: {reason}")


def run_agent(runner: Runner, recipes: list[Recipe], facts: dict[str, bool], settings: Settings, log: Log,
              study: str = "bench", events: LogEvents | None = None) -> tuple[Report, float]:
    """autotune's agent, as `autotune tune --in-process` runs it, on in-memory storage:
    its report and its wall time (s). `events` hears its trials (`LogEvents.timeline`)."""
    events = events or LogEvents(log)
    agent = Agent(runner, recipes, optuna.storages.InMemoryStorage(), study, settings, facts, events=events)
    events.t0 = t0 = time.perf_counter()
    report = agent.run()
    return report, time.perf_counter() - t0


def remeasure(runner: Runner, a: TrainConfig, b: TrainConfig) -> Comparison:
    """B over A again, from as many interleaved pairs as the protocol has windows."""
    try:
        xs, ys = runner.interleave(a, b, runner.protocol.windows)
    except TrialFailed as exc:
        return Comparison(ratio=None, low=None, high=None, pairs=0, failed=f"{exc.kind.value}: {exc.reason}")
    return Comparison(**paired_ratio(xs, ys), a=xs, b=ys)


def harmonic(xs: list[float]) -> float:
    """Samples over time of equal-sample windows: the harmonic mean of their throughputs."""
    xs = [x for x in xs if x > 0]
    return len(xs) / sum(1 / x for x in xs) if xs else 0.0


# The judge's size, from the noise model (a config's windows vary ~5-13%, each session of it
# is offset by ~4-8%): one look (two windows of each of two configs, each in its own session)
# varies their log ratio by ~0.09-0.12, so a fraction within +-5% (95%) needs ~13-25 looks.
# On FakeRunner with 8% sessions and 5% windows, a pick truly 0.93x of the best read >= 0.95 in
# 44% of 300 runs with 6 looks, 34% with 12, 28% with 16 (the old judge: ~40%, or 55% with the
# extra rounds that stopped once autotune's config led). At most 16: the judge then measures
# 32 windows and opens 16 sessions per config (the grid's best few twice: figures and picks).
JUDGE_WINDOWS = 2  # windows of each config per block: one round each way, so drift within a block cancels
JUDGE_LOOKS = (6, 16)  # figure blocks (looks): at least, at most
JUDGE_HALF_WIDTH = 0.05  # stop once every interval of a config against a grid config is within +-5%


def _half_width(windows: dict[tuple, list[float]], sessions: dict[tuple, list[int]], a: tuple, b: tuple) -> float:
    """The half-width (log) of b/a's interval over the sessions they share (inf with fewer than 2)."""
    r = session_ratio(windows[a], sessions[a], windows[b], sessions[b])
    if r["pairs"] < 2 or r.get("looks", 0) < 2 or not math.isfinite(r["high"]):
        return math.inf
    return math.log(r["high"] / r["ratio"])


def session_ratio(a: list[float], a_sessions: list[int], b: list[float], b_sessions: list[int]) -> dict[str, Any]:
    """b/a from windows taken in turns, each tagged with the session (process) it came from.
    Where the two shared more than one session, each session's pairs are one look and the
    interval is the spread between looks (`looks_ratio`): windows of one session share its
    placement, so its pairs are not independent draws (resnet_jpeg's channels_last with
    one thread over the default read 1.20x, 1.14x and 0.94x in three fresh sessions of five
    pairs, each look's own pairs within +-7%). With one session, its pairs (`paired_ratio`)."""
    shared = sorted(set(a_sessions) & set(b_sessions))
    looks = [([x for x, t in zip(a, a_sessions) if t == s], [y for y, t in zip(b, b_sessions) if t == s])
             for s in shared]
    if sum(min(len(xs), len(ys)) > 1 for xs, ys in looks) < 2:
        return paired_ratio([x for xs, ys in looks for x in xs[:len(ys)]],
                            [y for xs, ys in looks for y in ys[:len(xs)]])
    return looks_ratio(looks, [])


def judge(runner: Runner, configs: dict[str, TrainConfig], infeasible: set[str], log: Log,
          top: list[str] | tuple[str, ...] = (), looks: tuple[int, int] | None = None) -> dict[str, Any]:
    """Every distinct config re-measured alike, in blocks; `infeasible` labels count as 0 unmeasured.

    A figure block opens a fresh session of every config and takes `JUDGE_WINDOWS` windows of
    each in turns (the order reversed each round, rotated each block); each block is one look
    of every ratio (`session_ratio`: the spread between sessions). Where `top` names several
    configs (the grid's best few), a pick block of those alone follows each figure block: the
    fastest of them (`fastest`) is picked on those blocks, never on the figures' windows or
    sessions (a pick on the windows or sessions that then measure it reads it high: the
    winner's curse). Blocks go on until every config's interval against every `top` config is
    within +-JUDGE_HALF_WIDTH, between `looks` (default `JUDGE_LOOKS`) figure blocks: a rule on
    widths alone, the same for every method's config whichever leads.

    Returns per label the figure windows, their sessions and throughput, `ratio(a, b)`-ready;
    `windows` and `sessions` the judge's own cost.
    """
    t0 = time.perf_counter()
    distinct: dict[tuple, list[str]] = {}
    for label, cfg in configs.items():
        if label not in infeasible:
            distinct.setdefault(_key(cfg), []).append(label)
    keys = list(distinct)
    pickers = list(dict.fromkeys(_key(configs[t]) for t in top if t in configs and t not in infeasible))
    split = len(pickers) > 1
    failed: dict[tuple, str] = {}
    windows: dict[tuple, list[float]] = {k: [] for k in keys}
    chosen_on: dict[tuple, list[float]] = {k: [] for k in keys}
    sessions: dict[tuple, list[int]] = {k: [] for k in keys}  # the block (session) of each of `windows`
    cost = {"windows": 0, "sessions": 0, "rounds": 0}

    def block(b: int, play: list[tuple], figures: bool) -> None:
        play = [k for k in play if k not in failed]
        play = play[b % len(play):] + play[:b % len(play)] if play else play
        handles = {}
        try:
            for k in play:
                try:
                    handles[k] = runner.open(configs[distinct[k][0]])
                    cost["sessions"] += 1
                except TrialFailed as exc:
                    failed[k] = f"{exc.kind.value}: {exc.reason}"
            for r in range(JUDGE_WINDOWS):
                for k in (play if r % 2 == 0 else play[::-1]):
                    if k in failed:
                        continue
                    try:
                        thr = handles[k].window()
                    except TrialFailed as exc:
                        failed[k] = f"{exc.kind.value}: {exc.reason}"
                        continue
                    cost["windows"] += 1
                    if figures:
                        windows[k].append(thr), sessions[k].append(b)
                    else:
                        chosen_on[k].append(thr)
                cost["rounds"] += 1
        finally:
            for h in handles.values():
                h.close()

    def widths():
        ok = [k for k in keys if k not in failed]
        return (_half_width(windows, sessions, t, k) for t in pickers if t in ok for k in ok if k != t)

    least, most = looks or JUDGE_LOOKS
    done = 0
    while done < most and (done < least or any(w > JUDGE_HALF_WIDTH for w in widths())):
        block(done, keys, figures=True)
        if split:
            block(done, pickers, figures=False)
        done += 1
        log(f"  judge block {done} of {least}-{most}")
    width = max(widths(), default=0.0)
    out: dict[str, Any] = {"wall_s": time.perf_counter() - t0, "labels": {}, "split": split, "looks": done,
                           "half_width": math.expm1(width) if math.isfinite(width) else None, **cost}
    for label, cfg in configs.items():
        k = _key(cfg)
        if label in infeasible or k in failed:
            out["labels"][label] = {"samples_per_s": 0.0, "windows": [], "config": cfg.flat(),
                                    "reason": "infeasible in its measurement" if label in infeasible else failed[k]}
        else:
            out["labels"][label] = {"samples_per_s": harmonic(windows[k]), "windows": windows[k], "config": cfg.flat(),
                                    "sessions": sessions[k], "same_as": [x for x in distinct[k] if x != label]}
            if split and k in pickers:
                out["labels"][label] |= {"selection_samples_per_s": harmonic(chosen_on[k]),
                                         "selection_windows": chosen_on[k]}
    return out


def fastest(judged: dict[str, Any], labels: list[str]) -> str:
    """The fastest of `labels` by the judge's selection windows (its figures when not split)."""
    figure = "selection_samples_per_s" if judged.get("split") else "samples_per_s"
    return max(labels, key=lambda t: judged["labels"][t].get(figure, 0.0))


def ratio(judged: dict[str, Any], a: str, b: str) -> dict[str, Any]:
    """Judged throughput of `b` over `a` from the windows taken in turns, with a 95% CI
    over the sessions they share (`session_ratio`)."""
    la, lb = judged["labels"][a], judged["labels"][b]
    if la["samples_per_s"] == 0 and lb["samples_per_s"] > 0:  # only b is feasible: b is better without bound
        return {"ratio": None, "low": None, "high": None, "pairs": 0, "only_b_feasible": True}
    if la["samples_per_s"] == 0 or lb["samples_per_s"] == 0:
        r = lb["samples_per_s"] / la["samples_per_s"] if la["samples_per_s"] else 1.0
        return {"ratio": r, "low": r, "high": r, "pairs": 0, "infeasible": True}
    if la["config"] == lb["config"]:
        return {"ratio": 1.0, "low": 1.0, "high": 1.0, "pairs": len(la["windows"]), "same_config": True}
    return session_ratio(la["windows"], la["sessions"], lb["windows"], lb["sessions"])
