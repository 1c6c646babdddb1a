"""The compared methods, each measuring through one `Runner` under the suite's protocol.

- `run_single`: one config (the rule of thumb).
- `search_stored`: Optuna's TPE or random sampler over the grid's knobs, no diagnosis, a
  given trial budget, looking each config up in the stored grid (`grids`).
- `run_agent`: autotune's `Agent`, with its diagnosis, on in-memory Optuna storage.
- `judge`: the configs the methods chose, re-measured in turns (round robin, the order
  reversed every round) so that drift of the machine hits them alike; a method's figure
  is this fresh measurement, not the best of its own noisy search. Where it also picks the
  grid's best among a few, it picks on rounds of their own (`held_out`).

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
    grid instead of measuring it: a trial's figure and wall time are the stored ones. A
    config suggested again (also after normalisation) reuses its figure, still counts as a
    trial and costs no time."""
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
    wall = 0.0

    def objective(trial: optuna.Trial) -> float:
        nonlocal wall
        params = {k: trial.suggest_categorical(k, v) for k, v in grid.items()}
        try:
            k = key(normalized(TrainConfig(), params))
        except ConfigError:
            k = None
        row = rows.get(k) if k else None
        if row is not None and k not in seen:
            wall += row["wall_s"]
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
    return {"trials": len(trace), "measured": len(seen), "wall_s": wall, "trace": trace,
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


def held_out(r: int) -> bool:
    """Whether judge round `r` of a split judge is held out for the figures (rounds 1, 2, 5,
    6, ...: each half gets both orders of the round robin)."""
    return r % 4 in (1, 2)


JUDGE_HALF_WIDTH = 0.05  # a focus interval within +-5% of its ratio is precise enough
JUDGE_ROUNDS = 4  # at most this many times the protocol's rounds (the extra ones play the focus configs alone)


def _widest(focus: tuple[str, list[str]], configs: dict[str, TrainConfig], windows: dict[tuple, list[float]],
            chosen_on: dict[tuple, list[float]], failed: dict[tuple, str], sessions: dict[tuple, list[int]]) -> float:
    """The half-width (log ratio) of the focus label's interval against the leader of the
    others so far (the leader picked on `chosen_on` when split; the interval over
    `sessions`); 0 when the focus label is the leader's config."""
    label, others = focus
    mine = _key(configs[label]) if label in configs else None
    keys = {_key(configs[o]) for o in others if o in configs} - set(failed)
    keys = [k for k in keys if k in windows]
    if mine is None or mine not in windows or mine in failed or not keys:
        return 0.0
    leader = max(keys, key=lambda k: harmonic(chosen_on[k] or windows[k]))
    if leader == mine:
        return 0.0
    if len(set(sessions[mine]) & set(sessions[leader])) < 2:
        return math.inf  # one session each: the spread between sessions is not seen yet
    r = session_ratio(windows[mine], sessions[mine], windows[leader], sessions[leader])
    return math.log(r["high"] / r["ratio"]) if r["pairs"] > 1 else math.inf


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
          split: bool = False, focus: tuple[str, list[str]] | None = None) -> dict[str, Any]:
    """Windows of every distinct config in turns; `infeasible` labels count as 0 unmeasured.

    `split`: twice the rounds, half of them (`held_out`) for every figure and ratio and the
    other half, `selection_windows`, for picking a winner among configs (the grid's best
    few). The fastest of several on the same windows that then measure it is biased up
    (the winner's curse: of three equal configs whose windows vary 20%, the fastest of five
    windows each read ~9% high on FakeRunner), which would count against any other method.

    `focus`: (label, others): past the protocol's rounds, rounds go on in blocks of four
    (both orders), each block in fresh sessions of those configs and held out or picking
    in alternate blocks (a lucky session would otherwise pick its config and then measure
    it), while the interval of `label` against the leader of `others` (the fastest so far, when it is
    another config) is wider than +-JUDGE_HALF_WIDTH (`session_ratio`: the spread between
    sessions, so at least one fresh block where the two differ), up to JUDGE_ROUNDS
    times the rounds: on a machine whose windows vary 20%, five pairs leave a 0.95 point
    estimate between two equal configs to chance (decode_bound: 0.74 [0.54, 1.00], then
    0.91 [0.76, 1.09]); a quiet case stops a few blocks in. Those rounds play
    only `label` and `others`: the question is theirs, and a pair's two windows then lie
    at most a few windows apart instead of the whole round robin (compute_bound's windows
    of one config drifted from ~2,700 to ~4,000 samples/s within its judge).

    Returns per label the windows, their sessions and throughput, `ratio(a, b)`-ready.
    """
    t0 = time.perf_counter()
    distinct: dict[tuple, list[str]] = {}
    for label, cfg in configs.items():
        if label not in infeasible:
            distinct.setdefault(_key(cfg), []).append(label)
    keys = list(distinct)
    rounds = runner.protocol.windows * (2 if split else 1)
    handles, failed = {}, {}
    windows: dict[tuple, list[float]] = {k: [] for k in keys}
    chosen_on: dict[tuple, list[float]] = {k: [] for k in keys}
    sessions: dict[tuple, list[int]] = {k: [] for k in keys}  # the session of each of `windows`
    session: dict[tuple, int] = {}

    def start(k: tuple, s: int) -> None:
        if k in handles:
            handles.pop(k).close()
        try:
            handles[k], session[k] = runner.open(configs[distinct[k][0]]), s
        except TrialFailed as exc:
            failed[k] = f"{exc.kind.value}: {exc.reason}"

    try:
        for k in keys:
            start(k, 0)

        def play(r: int, keys: list[tuple], held: bool | None = None) -> None:
            for k in (keys if r % 2 == 0 else keys[::-1]):
                if k in failed or k not in handles:
                    continue
                try:
                    thr = handles[k].window()
                except TrialFailed as exc:
                    failed[k] = f"{exc.kind.value}: {exc.reason}"
                    continue
                if not split or (held_out(r) if held is None else held):
                    windows[k].append(thr), sessions[k].append(session[k])
                else:
                    chosen_on[k].append(thr)
            log(f"  judge round {r + 1}/{rounds}")

        for r in range(rounds):
            play(r, keys)
        cap, block = rounds * JUDGE_ROUNDS, 0
        if focus:
            mine = {_key(configs[x]) for x in (focus[0], *focus[1]) if x in configs}
            few = [k for k in keys if k in mine]
        while focus and rounds + 4 <= cap and \
                _widest(focus, configs, windows, chosen_on, failed, sessions) > JUDGE_HALF_WIDTH:
            log(f"  judge: {focus[0]} against the leading grid config still wider than +-{JUDGE_HALF_WIDTH:.0%}; "
                f"4 rounds more of those {len(few)} configs, each in a fresh session")
            rounds, block = rounds + 4, block + 1
            for k in few:
                if k not in failed:
                    start(k, block)
            for r in range(rounds - 4, rounds):
                play(r, few, held=block % 2 == 1 if split else None)
    finally:
        for h in handles.values():
            h.close()
    out: dict[str, Any] = {"wall_s": time.perf_counter() - t0, "labels": {}, "split": split, "rounds": rounds}
    for label, cfg in configs.items():
        k = _key(cfg)
        if label in infeasible or k in failed:
            out["labels"][label] = {"samples_per_s": 0.0, "windows": [], "config": cfg.flat(),
                                    "reason": "infeasible in its measurement" if label in infeasible else failed[k]}
        else:
            out["labels"][label] = {"samples_per_s": harmonic(windows[k]), "windows": windows[k], "config": cfg.flat(),
                                    "sessions": sessions[k], "same_as": [x for x in distinct[k] if x != label]}
            if split:
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
