"""The waste a run stops with: why the lever that targets it stopped where it did (a limit
of the host, more of it reading no faster, or no lever at all), and what a person can do
beyond autotune's knobs. Everything said is read from the run's own measurements.
"""

from __future__ import annotations

from typing import Any

from . import handoff, machine
from .config import TrainConfig
from .diagnose import ADVICE, CPU_BOUND_LOADING, material
from .record import Bottleneck, Leftover, Limit, Step, Summary, TrialState, Verdict, Waste
from .units import format_bytes

__all__ = ["BEYOND", "INPUT_CPU", "INPUT_IO", "KNOBS", "WORKERS", "leftover", "words"]

WORKERS = "data.num_workers"  # the loader's lever: the knob whose range grows with the host
KNOBS = "beyond autotune's knobs"  # where the advice of `BEYOND` and `INPUT_*` applies
HANDOFF_SAID = 0.5  # the hand-off is named where it is at least this share of the wait left: most of it

INPUT_IO = ("fewer, larger reads per sample (pack samples into shards read in sequence), cache the samples in "
            "memory or on local disk after their first read, or a faster store")
INPUT_CPU = ("less CPU work per sample: decode once ahead of time and store the decoded, resized samples; a "
             "faster decoder; less augmentation on the CPU; or more cores")
BEYOND = {  # wastes whose fix lies in the data or the model, past any knob (ADVICE's lie in the user's code)
    Bottleneck.TRANSFER: "copy fewer bytes per step: send compact dtypes (uint8 images) and convert them on the device",
    Bottleneck.LAUNCH: "fewer, larger operations per step: a larger batch, or vectorised model code in place of "
                       "Python loops over small tensors",
}


def leftover(verdict: Verdict, margin: float, config: TrainConfig, summaries: list[Summary | None], steps: list[Step],
             band: float, handoff_s: float | None = None, why_not: str = "") -> Leftover | None:
    """The first material waste other than compute in `verdict`, why no recipe is left for it and
    what a person can do; None where none is left. `summaries`: the final config's first, then
    any other (the baseline); `why_not`: why its recipes were not searched, where known."""
    top = next((w for w in verdict.wastes if w.cls is not Bottleneck.COMPUTE and material(w, margin)), None)
    if top is None:
        return None
    what = "bottleneck" if top.cls is verdict.bottleneck else "waste"  # the model's own work may be larger
    reason = f"no recipe left for the {top.cls.value} {what} ({top.reason})"
    if top.cls is Bottleneck.INPUT:
        return _input(top, reason, margin, config, [s for s in summaries if s is not None], steps, band, handoff_s,
                      why_not)
    if top.cls in ADVICE:
        return Leftover(waste=top.cls, reason=reason, advice=f"in your code: {ADVICE[top.cls]}")
    return Leftover(waste=top.cls, reason=reason, advice=f"{KNOBS}: {BEYOND[top.cls]}" if top.cls in BEYOND else "")


def words(left: Leftover) -> str:
    """What `stop_reason` says of `left`: the reason, why its lever stopped, and the advice."""
    return "; ".join(x for x in (left.reason, left.why, left.advice) if x)


def _input(waste: Waste, reason: str, margin: float, config: TrainConfig, summaries: list[Summary],
           steps: list[Step], band: float, handoff_s: float | None, why_not: str) -> Leftover:
    """An input wait left: why the loader stopped, and the advice for I/O or CPU-bound loading."""
    cpu = machine.loading_cpu_share(summaries)
    cpu_bound = cpu is not None and cpu >= CPU_BOUND_LOADING
    limit, why, ev = _workers(config, summaries, steps, band, cpu_bound)
    if cpu is not None:
        ev["data_cpu_share"] = round(cpu, 4)
    if limit is None and why_not:
        share = handoff.step_share(handoff_s, config, summaries[0]) if summaries else None
        limit = Limit.HANDOFF if handoff.gates(waste, share, margin) else None
    why = "; ".join(x for x in (why, why_not) if x)
    wait = summaries[0].stages.get("data") if summaries else None
    if handoff_s is not None and wait is not None and config.get(WORKERS):
        ev.update(batch_handoff_s=handoff_s, data_wait_s=wait.s)
        if handoff_s >= HANDOFF_SAID * wait.s:
            why += (f"; receiving each batch from a worker costs {handoff_s * 1e3:.2f} ms here, of the "
                    f"{wait.s * 1e3:.2f} ms the step still waits for one: no worker count shortens that part")
    return Leftover(waste=waste.cls, reason=reason, limit=limit, why=why,
                    advice=f"{KNOBS}: {INPUT_CPU if cpu_bound else INPUT_IO}", evidence=ev)


def _workers(config: TrainConfig, summaries: list[Summary], steps: list[Step], band: float,
             cpu_bound: bool) -> tuple[Limit | None, str, dict[str, Any]]:
    """Why the loader's worker count stopped where the final config has it, from the trials of
    the rounds that changed it and this host's limits; (None, "", {}) where none changed it."""
    reads: dict[int, float] = {}
    fails: dict[int, str] = {}
    for t in (t for s in steps for t in s.trials if WORKERS in t.changes and t.config):
        n = t.config.get(WORKERS)
        if t.state in (TrialState.OK, TrialState.SLOW) and t.samples_per_s:
            reads[n] = max(reads.get(n, 0.0), t.samples_per_s)
        elif t.state in (TrialState.FAILED, TrialState.INFEASIBLE):
            fails.setdefault(n, t.reason or t.state.value)
    if not reads and not fails:
        return None, "", {}
    w = config.get(WORKERS) or 0
    cores = machine.cores()
    ev: dict[str, Any] = {"workers": w, "readings": {str(n): round(v, 2) for n, v in sorted(reads.items())},
                          "band": round(band, 4), "cores": cores}
    cpu = machine.loading_cpu_share(summaries)
    cpu_words = (f"loading is CPU work ({cpu:.0%} of its wait): the {cores} cores are the limit, not the worker "
                 f"count" if cpu_bound and cpu else "")
    if w == 0:
        base = next((s.before.samples_per_s for s in steps if any(WORKERS in t.changes for t in s.trials)), None)
        best = max(reads, key=reads.get, default=None)
        said = (f" (the best, {best} workers, read {reads[best] / base:.2f}x of loading in the step)"
                if best is not None and base else "")
        why = f"loader workers were measured up to {max([*reads, *fails])} and none was kept{said}"
        return (Limit.CORES if cpu_bound else Limit.NO_FASTER), "; ".join(x for x in (why, cpu_words) if x), ev
    at = reads.get(w) or (summaries[0].samples_per_s if summaries else None)
    above = sorted(n for n in reads if n > w)
    failed = sorted(n for n in fails if n > w and n not in reads)
    could_not = "; ".join(f"{n} workers could not run ({fails[n]})" for n in failed[:2])
    if above and at:
        ratios = {n: reads[n] / at for n in above}
        top = max(ratios.values())
        each = ", ".join(f"{n} workers read {r:.2f}x" if i == 0 else f"{n} {r:.2f}x"
                         for i, (n, r) in enumerate(list(ratios.items())[:3]))
        lead = ("a larger count read faster on one reading, and side by side did not confirm it" if top > band else
                "more workers read no faster beyond the noise" if top >= 1 / band else
                "more workers read slower, beyond the noise")
        why = (f"the loader stopped at {w} workers: {lead} ({each} of {w}'s reading; a single reading's noise band "
               f"here is {band:.2f}x)")
        why = "; ".join(x for x in (why, could_not, cpu_words) if x)
        return (Limit.CORES if cpu_bound else Limit.NO_FASTER), why, ev
    if failed:
        return Limit.FAILED, f"the loader stopped at {w} workers: {could_not}", ev
    busy = machine.saturating(WORKERS, w, *summaries)
    if busy:
        return Limit.CORES, (f"the loader stopped at {w} workers: loading is CPU work ({cpu:.0%} of its "
                             f"wait), and {w} workers already exceed the {busy:.1f} that keep the {cores} "
                             f"cores busy: more would only share them"), ev
    limits = machine.worker_limits(summaries)
    ev["host_limits"] = {k.value: v for k, v in limits.items()}
    kind, most = min(limits.items(), key=lambda kv: kv[1])
    if most <= w:
        return kind, (f"the loader stopped at {w} workers: the host allows at most {most} workers "
                      f"({_host(kind, summaries)})"), ev
    return Limit.SEARCH, (f"the loader stopped at {w} workers: no larger count was measured before the range's "
                          f"growth or the run's trials ran out (this host allows up to {most}): more workers are "
                          f"untested here"), ev


def _host(kind: Limit, summaries: list[Summary]) -> str:
    """Which limit of the host bounds the workers, and the numbers it is read from."""
    if kind is Limit.OPEN_FILES:
        return (f"open files: a limit of {machine.open_files_limit()}, {machine.FILES_PER_WORKER} per worker; "
                f"`ulimit -n` raises it")
    if kind is Limit.MEMORY:
        rss = max(s.peak_rss_bytes for s in summaries if s.peak_rss_bytes)
        avail = machine.available_memory_bytes() or 0
        return (f"memory: each worker may hold the {format_bytes(rss)} the training process did, and workers get "
                f"{machine.WORKER_MEMORY_SHARE:.0%} of the {format_bytes(avail)} available")
    return (f"cores: loading is CPU work ({machine.loading_cpu_share(summaries):.0%} of its wait), {machine.OVERSUBSCRIBE} workers "
            f"per core on {machine.cores()} cores")
