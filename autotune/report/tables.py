"""The tables and sentences both renderers draw, built once from the typed `Report`.

A table is headers and rows of cells; a cell is text, `Code`, or a list of those (one per
line). The Markdown and HTML renderers only decide how a cell looks. Parts an interrupted
run did not record are None in the model and read "not recorded" here.
"""

from __future__ import annotations

from typing import Any, Callable

from autotune import probe
from autotune.clock import STAGES
from autotune.leftover import words
from autotune.record import Report, Step, Summary, Verdict

from .fmt import (
    Code, change_list, fmt_bytes, fmt_ci, fmt_delta_bytes, fmt_evidence, fmt_ms, fmt_pct_change, fmt_rate,
    fmt_ratio, fmt_seconds, fmt_speedup, fmt_value, number,
)

__all__ = [
    "NOT_RECORDED", "Table", "budget_text", "comparison_table", "evidence_table", "waste_table", "headline", "noise_text",
    "noise_warning", "protocol_table", "recommendation_table", "run_table", "stage_ms", "stage_names", "stage_table",
    "step_title", "step_verdict", "stop_lines", "trial_table", "verdict_word",
]

Table = tuple[list[str], list[list[Any]]]
NOT_RECORDED = "not recorded"

_PROTOCOL_LABELS = {
    "warmup_steps": "warm-up steps", "steps": "measured steps per window", "windows": "windows",
    "seed": "seed", "profile_steps": "profiled steps", "window_rule": "window rule", "throughput": "throughput",
}


def stage_names(*summaries: Summary | None) -> list[str]:
    """The known stages in step order, then any other stage a summary holds, sorted."""
    extra = {k for s in summaries if s is not None for k in s.stages if k not in STAGES}
    return list(STAGES) + sorted(extra)


def stage_ms(summary: Summary, stage: str) -> float | None:
    """Milliseconds per step spent in `stage`, or None when not recorded or not finite."""
    st = summary.stages.get(stage)
    s = None if st is None else number(st.s)
    return None if s is None else s * 1e3


def lowp_text(lowp: dict[str, float]) -> str:
    """What the low-precision probe measured, e.g. "matmuls: bf16 24.1x fp32, fp16 1.0x"."""
    return f"matmuls: {probe.text(lowp)} fp32's" if lowp else ""


def run_table(report: Report) -> Table:
    """What ran where: workload, target, device, machine, memory limit, study, version."""
    m = report.machine
    machine = ", ".join(p for p in (
        m.cpu, f"{m.cores} cores" if m.cores else "", f"GPU {m.gpu}" if m.gpu else "",
        f"torch {m.torch}" if m.torch else "", f"Python {m.python}" if m.python else "",
        lowp_text(m.lowp_matmul),
        f"a loader worker's batch received in {m.batch_handoff_s * 1e3:.2f} ms" if m.batch_handoff_s else "",
    ) if p)
    limit = report.memory_limit_bytes
    study = report.study
    where = f"{study.name} in {study.storage}" if study.storage else study.name
    rows = [
        ["workload", report.workload or NOT_RECORDED],
        ["target", Code(report.target) if report.target else NOT_RECORDED],
        ["device", report.device or NOT_RECORDED],
        ["machine", machine or NOT_RECORDED],
        ["memory limit", f"{fmt_bytes(limit)} ({limit_counts(report.device)})" if limit else "none"],
        ["study", Code(where) if where else NOT_RECORDED],
        ["autotune", report.autotune_version or NOT_RECORDED],
    ]
    return ["", ""], rows


def limit_counts(device: str | None) -> str:
    """What a config's peak memory, held against the limit, counts on `device`."""
    if (device or "").startswith("cuda"):
        return ("counted: the allocator's peak allocated memory over the profiled steps; its reserved but unused "
                "memory, the CUDA context and NCCL buffers are not: leave headroom")
    return ("counted: the peak of tensors allocated over the profiled steps plus the model's parameters, buffers "
            "and optimizer state; not the process's resident memory (Python, libraries, loader workers)")


def protocol_table(report: Report) -> Table:
    """The measurement protocol, one setting a row."""
    rows = [[_PROTOCOL_LABELS.get(k, k), fmt_value(v)] for k, v in report.protocol.model_dump().items()]
    return ["", ""], rows


def _step_ms(key: str) -> Callable[[Summary], float | None]:
    def get(s: Summary) -> float | None:
        v = number(getattr(s.step_time_s, key))
        return None if v is None else v * 1e3

    return get


def _one_time(key: str) -> Callable[[Summary], float | None]:
    return lambda s: s.one_time.get(key)


def _cv(v: Any) -> str:
    return "n/a" if number(v) is None else f"{v:.1%}"


def comparison_table(report: Report) -> Table:
    """Baseline beside final: throughput, step time, spread, memory, one-time costs."""
    b, f = report.baseline, report.final

    def row(label: str, get: Callable[[Summary], Any], fmt: Callable[[Any], str], change: str | None = None) -> list[Any]:
        vb = get(b) if b is not None else None
        vf = get(f) if f is not None else None
        return [label, fmt(vb) if b is not None else NOT_RECORDED, fmt(vf) if f is not None else NOT_RECORDED,
                change if change is not None else fmt_pct_change(vb, vf)]

    mem_b = number(b.peak_memory_bytes) if b is not None else None
    mem_f = number(f.peak_memory_bytes) if f is not None else None
    rows = [
        row("throughput (samples/s)", lambda s: s.samples_per_s, fmt_rate),
        row("step time median", _step_ms("median"), fmt_ms),
        row("step time p90", _step_ms("p90"), fmt_ms),
        row("spread across windows (CV)", lambda s: s.window_cv, _cv, ""),
        row("peak tensor memory", lambda s: s.peak_memory_bytes, fmt_bytes,
            fmt_delta_bytes(mem_f - mem_b) if mem_b is not None and mem_f is not None else ""),
        row("peak RSS", lambda s: s.peak_rss_bytes, fmt_bytes, ""),
        row("setup (one-time)", _one_time("setup_s"), fmt_seconds, ""),
        row("first step (one-time)", _one_time("first_step_s"), fmt_seconds, ""),
        row("first batch (one-time)", _one_time("loader_first_batch_s"), fmt_seconds, ""),
        row("measured steps", lambda s: s.measured_steps, fmt_value, ""),
    ]
    return ["", "baseline", "final", "change"], rows


def stage_table(report: Report) -> Table:
    """Milliseconds and share of the step per stage, baseline beside final."""
    b, f = report.baseline, report.final

    def cells(s: Summary | None, stage: str) -> list[str]:
        if s is None or not s.stages:
            return [NOT_RECORDED, ""]
        st = s.stages.get(stage)
        share = None if st is None else number(st.share)
        return [fmt_ms(stage_ms(s, stage)), "n/a" if share is None else f"{share:.1%}"]

    rows = [[stage, *cells(b, stage), *cells(f, stage)] for stage in stage_names(b, f)]
    return ["stage", "baseline ms/step", "share", "final ms/step", "share"], rows


def evidence_table(verdict: Verdict) -> Table:
    """The numbers that decided a diagnosis; sizes (`*_bytes`) in units."""
    rows = [[Code(k), fmt_bytes(v) if k.endswith("_bytes") and number(v) else fmt_evidence(v)]
            for k, v in verdict.evidence.items() if v is not None]
    return ["evidence", "value"], rows


def waste_table(verdict: Verdict) -> Table:
    """Every class whose rule fired, ranked: its share of the step and the most a fix could gain."""
    rows = [[w.cls.value, f"{w.share:.1%}", "—" if w.max_gain is None else fmt_ratio(w.max_gain), w.reason]
            for w in verdict.wastes]
    return ["waste", "share of step", "at most", "why"], rows


def _one_time_cell(one_time: float | None) -> str:
    t = number(one_time)
    return "n/a" if t is None else "none" if t <= 0 else fmt_seconds(t)


def _payoff_cell(steps: int | None) -> str:
    n = number(steps)
    return "—" if n is None else "at once" if n <= 0 else f"{n:,.0f} steps"


def recommendation_table(report: Report) -> Table:
    """Every recommendation as ranked: changes, gain with interval, memory, costs, verdict."""
    rows = []
    for i, r in enumerate(report.recommendations, 1):
        low, high = (list(r.ci) + [None, None])[:2]
        verdict = verdict_word(r.accepted, r.tried) + (f": {r.reason}" if r.reason else "")
        rows.append([
            str(i), r.recipe, change_list(r.changes) or "no change", fmt_ratio(r.speedup), fmt_ci(low, high),
            fmt_delta_bytes(r.memory_delta_bytes), _one_time_cell(r.one_time_s), _payoff_cell(r.payoff_steps), verdict,
        ])
    headers = ["#", "recipe", "changes", "speedup", "CI", "memory", "one-time cost", "pays off after", "verdict"]
    return headers, rows


def trial_table(step: Step) -> Table:
    """A step's trials in the order tried; who measured each when more than one process did."""
    who = {(t.worker.host, t.worker.pid) for t in step.trials if t.worker}
    rows = [[fmt_value(t.number), change_list(t.changes) or "baseline config", fmt_rate(t.samples_per_s),
             t.state.value, fmt_bytes(t.peak_memory_bytes), _note(t)]
            + ([_worker_cell(t)] if len(who) > 1 else []) for t in step.trials]
    headers = ["trial", "changes", "samples/s", "state", "peak memory", "note"]
    return headers + (["measured by"] if len(who) > 1 else []), rows


def _note(t) -> str:
    reused = f"the reading of {t.reused_from}, not measured again" if t.reused_from else ""
    return "; ".join(x for x in (t.reason, reused) if x)


def _worker_cell(t) -> str:
    if t.worker is None:
        return ""
    cores = t.worker.cores
    span = f"{cores[0]}-{cores[-1]}" if len(cores) > 1 and cores == list(range(cores[0], cores[-1] + 1)) else \
        ",".join(map(str, cores))
    return f"{t.worker.host}:{t.worker.pid} (cores {span})"


def verdict_word(accepted: bool, tried: bool) -> str:
    """`accepted`, `rejected`, or `not tried` for a round that measured no config (the time
    budget ran out first): an untested recipe is not a rejected one."""
    return "accepted" if accepted else "rejected" if tried else "not tried"


def step_title(step: Step) -> str:
    """`Round 1: dataloader (for input)`."""
    return f"Round {step.round}: {step.recipe} (for {step.bottleneck.value})"


def step_verdict(step: Step) -> str:
    """`accepted, 4.13× (CI 3.88–4.41, 4 pairs): why`."""
    verdict = verdict_word(step.accepted, bool(step.trials))
    measured = f", {fmt_speedup(step.speedup)}" if step.speedup is not None else ""
    return f"{verdict}{measured}" + (f": {step.reason}" if step.reason else "")


def headline(report: Report) -> str:
    """One sentence: the measured gain, or why there is none."""
    sp, b, f = report.speedup, report.baseline, report.final
    if sp is None or number(sp.ratio) is None:
        return "No final speedup was measured: the run stopped before its final measurement."
    thr = f": {fmt_rate(b.samples_per_s)} → {fmt_rate(f.samples_per_s)} samples/s" if b is not None and f is not None else ""
    return f"{fmt_ratio(sp.ratio)} the baseline's throughput (CI {fmt_ci(sp.low, sp.high)}){thr}."


def noise_text(report: Report) -> str:
    """What re-measuring the unchanged baseline gave, and the margin it sets."""
    n = report.noise
    if n is None or number(n.ratio) is None:
        return "The baseline's noise was not measured."
    bar = fmt_ratio(1 + n.min_gain) if number(n.min_gain) is not None else "its least gain"
    margin = (f"; a recipe is searched when its waste or a search reading promises more than this noise margin, "
              f"{fmt_ratio(n.margin)}, and a change is kept when its side-by-side looks give a gain past {bar} a "
              f"chance of at least {1 - n.alpha:g} under the noise model fitted to the A/As and the run's "
              f"repeated looks" if number(n.margin) is not None else "")
    again = ""
    all_ = ", ".join(fmt_ratio(m.ratio) for m in n.readings)
    if len(n.readings) == 2:
        again = f" Two A/As, each from a fresh pair of sessions ({all_}), pooled."
    elif len(n.readings) == 3:
        again = (f" The two A/As pooled were implausible for identical configs, so a third was measured ({all_}) "
                 "and the two nearest 1, pooled, set the margin.")
    elif len(n.readings) == 1:
        again = " A second A/A failed, so the first alone sets the margin."
    band = ""
    if number(n.band) is not None:
        whence = (f"the spread of this run's unpaired readings of one config: {n.band_dof} repeats, taken apart in time"
                  if n.band_dof else "the A/A's width")
        band = (f" A search's single reading within {fmt_ratio(n.band)} of the current config's was not taken as "
                f"slower or faster without a side-by-side comparison ({whence}).")
    return (f"Re-measuring the unchanged baseline (A/A, {n.pairs} interleaved pairs) gave "
            f"{fmt_ratio(n.ratio)} (CI {fmt_ci(n.low, n.high)}){margin}.{again}{band}")


def noise_warning(report: Report) -> str | None:
    """A warning where the measurements were too noisy to tell small gains from none (a busy machine,
    or a step whose time varies from batch to batch); None where they were not."""
    n = report.noise
    if n is None or not n.too_noisy():
        return None
    reads = ", ".join(f"{fmt_ratio(m.ratio)} (CI {fmt_ci(m.low, m.high)})" for m in n.readings if number(m.ratio))
    return (f"The measurements were noisy: the unchanged baseline against itself read {reads}, so single readings "
            f"within {fmt_ratio(n.band)} of each other could not be told apart. Gains smaller than that were likely "
            f"missed (what was kept still cleared its side-by-side looks). Either the machine was busy (run again "
            f"with nothing else running, `uptime`'s load near 0), or the step's own time varies from batch to batch "
            f"(variable-length inputs: more steps per window, `--steps`, average more batches into each reading).")


def stop_lines(report: Report) -> list[tuple[str, str]]:
    """Why the run stopped, as (label, text) lines: the reason, and where a waste was left, why
    its lever stopped where it did and what a person can do (and where: beyond autotune's knobs)."""
    left = report.leftover
    if left is None or report.stop_reason != words(left):
        return [("Stop reason", report.stop_reason or NOT_RECORDED)]
    out = [("Stop reason", left.reason)] + ([("Why it stopped there", left.why)] if left.why else [])
    where, _, what = left.advice.partition(": ")
    if left.advice:
        out.append((f"What you can do, {where}", what) if what else ("What you can do", left.advice))
    return out


def budget_text(report: Report) -> str:
    """`11 trials of 40; 5 min 0 s wall time.`, with the time budget when one was set."""
    b = report.budget
    if b is None:
        return NOT_RECORDED
    budget = f" of a {fmt_seconds(b.budget_s)} budget" if number(b.budget_s) else ""
    return f"{b.trials_used} trials of {b.trials_limit}; {fmt_seconds(b.wall_s)} wall time{budget}."
