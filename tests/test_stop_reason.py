"""A run that stops with a waste left says why its lever stopped where it did and what a
person can do beyond autotune's knobs: in `report.json` (`leftover`, and `stop_reason`'s
words), the terminal summary, `report.md` and `report.html`."""

from __future__ import annotations

import html

import optuna
import pytest
from test_report import make_report

from autotune import machine
from autotune.agent import Agent, Settings
from autotune.config import TrainConfig
from autotune.diagnose import ADVICE, diagnose
from autotune.leftover import INPUT_CPU, INPUT_IO, KNOBS, leftover, words
from autotune.recipes import load_recipes
from autotune.record import Bottleneck, Leftover, Limit, Report, Signals, Step, Summary, Verdict, Waste
from autotune.report import render_html, render_markdown
from autotune.report.tables import stop_lines
from autotune.report.terminal import console, print_tune_summary
from autotune.testing import FakeRunner

WAIT = {"data": 0.6, "forward": 0.2, "backward": 0.2}  # a wait no worker count removes


@pytest.fixture(autouse=True)
def host(monkeypatch):
    """A host of 2 cores whose open files and memory allow any worker count a test does not limit."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.setattr(machine, "open_files_limit", lambda: 10**6)
    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 10**13)


def _run(tmp_path, speed, signals=None, stages=lambda c: WAIT, handoff=None) -> Report:
    runner = FakeRunner(speed, noise=0.01, stages=stages, signals=signals, handoff=handoff)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    return Agent(runner, load_recipes(), storage, "s", Settings(only=("dataloader",)), {"conv": False}).run()


def _io(c: TrainConfig) -> float:
    """Latency-bound loading: each worker adds as much as loading in the step reads."""
    return 100.0 * (1 + c.data.num_workers)


def _peaks_at_6(c: TrainConfig) -> float:
    """Latency-bound loading that peaks at 6 workers and slows past them."""
    n = c.data.num_workers
    return 100.0 * (1 + min(n, 6)) * 0.9 ** max(0, n - 6)


def _cpu_bound(c: TrainConfig) -> dict:
    return {} if c.data.num_workers else {"data_cpu_share": 1.0}


def _shown(report: Report) -> dict[str, str]:
    """What the terminal summary, report.md and report.html say, whitespace made single spaces."""
    with console.capture() as cap:
        print_tune_summary(report, "runs/x")
    flat = {"terminal": cap.get(), "md": render_markdown(report), "html": html.unescape(render_html(report))}
    return {k: " ".join(v.split()) for k, v in flat.items()}


def _says(report: Report, *phrases: str) -> None:
    """Each of `phrases` in the terminal summary, report.md and report.html alike."""
    for where, text in _shown(report).items():
        for phrase in phrases:
            assert phrase in text, (where, phrase, text[-1500:])


SCENARIOS = {  # limit: (set up the host, true speed, signals, what the why says, the advice)
    Limit.NO_FASTER: (lambda mp: None, _peaks_at_6, None, "the loader stopped at 6 workers: more workers read slower",
                      INPUT_IO),
    Limit.OPEN_FILES: (lambda mp: mp.setattr(machine, "open_files_limit", lambda: 3 * machine.FILES_PER_WORKER), _io,
                       None, "the host allows at most 3 workers (open files: a limit of 24", INPUT_IO),
    Limit.MEMORY: (lambda mp: mp.setattr(machine, "available_memory_bytes", lambda: 8 * 10**8), _io, None,
                   "the host allows at most 4 workers (memory: each worker may hold", INPUT_IO),
    Limit.CORES: (lambda mp: None, lambda c: 100.0 * (1 + min(c.data.num_workers, 2)), _cpu_bound,
                  "the 2 cores", INPUT_CPU),
}


@pytest.mark.parametrize("limit", list(SCENARIOS), ids=lambda x: x.value)
def test_a_loader_stopped_by_a_limit_says_which_and_what_lies_beyond(tmp_path, monkeypatch, limit):
    setup, speed, signals, why, advice = SCENARIOS[limit]
    setup(monkeypatch)
    r = _run(tmp_path, speed, signals)
    assert r.steps and r.steps[0].recipe == "dataloader" and r.steps[0].accepted, [s.reason for s in r.steps]
    left = r.leftover
    assert left is not None and left.waste is Bottleneck.INPUT and left.limit is limit, left
    assert why in left.why and left.advice == f"{KNOBS}: {advice}"
    assert r.stop_reason == words(left) and r.stop_reason.startswith("no recipe left for the input bottleneck")
    assert f"beyond autotune's knobs: {advice}" in r.stop_reason
    assert Report.model_validate_json(r.model_dump_json()).leftover == left  # report.json keeps it
    _says(r, "no recipe left for the input bottleneck", "it stopped there", why, "beyond autotune's knobs", advice)


def test_the_terminal_and_both_files_label_the_why_and_the_advice(tmp_path, monkeypatch):
    SCENARIOS[Limit.OPEN_FILES][0](monkeypatch)
    r = _run(tmp_path, _io)
    shown = _shown(r)
    assert f"why it stopped there: {r.leftover.why}" in shown["terminal"]
    assert f"what you can do, beyond autotune's knobs: {INPUT_IO}" in shown["terminal"]
    assert "**Why it stopped there:**" in shown["md"] and "What you can do, beyond autotune's knobs" in shown["md"]
    assert "<b>Why it stopped there:</b>" in shown["html"] and f"knobs:</b> {INPUT_IO}" in shown["html"]


def test_a_loader_not_searched_for_its_hand_off_says_so_and_what_lies_beyond(tmp_path):
    """Receiving a batch from a worker costs more than loading it in the step: no loader trial."""

    def stages(c):
        return {"data": 0.06, "forward": 0.47, "backward": 0.47}

    r = _run(tmp_path, lambda c: 100.0, _cpu_bound, stages=stages, handoff=0.05)
    assert not r.steps
    assert r.leftover.limit is Limit.HANDOFF and "handing a batch over from a loader worker" in r.leftover.why
    assert r.leftover.advice == f"{KNOBS}: {INPUT_CPU}"
    _says(r, "handing a batch over from a loader worker costs 50.00 ms", "decode once ahead of time")


# --- the limit read from a record, without a run ------------------------------------------------------------------


def _summary(workers: int, samples_per_s: float, cpu: float | None = None, data_s: float = 0.006) -> Summary:
    step = 0.01
    return Summary(config=TrainConfig().with_changes({"data.num_workers": workers}).flat(),
                   step_time_s={"median": step, "p90": step, "mean": step}, samples_per_s=samples_per_s,
                   windows_samples_per_s=[samples_per_s] * 3, window_cv=0.0,
                   stages={"data": {"s": data_s, "share": data_s / step},
                           "forward": {"s": step - data_s, "share": 1 - data_s / step}},
                   peak_rss_bytes=10**8, signals=Signals(data_cpu_share=cpu))


def _step(readings: dict[int, float | None], before: float = 100.0) -> Step:
    trials = [{"number": i, "changes": {"data.num_workers": [0, n]}, "samples_per_s": v,
               "state": "ok" if v else "failed", "reason": None if v else "the trial process killed by signal 9",
               "config": TrainConfig().with_changes({"data.num_workers": n}).flat()}
              for i, (n, v) in enumerate(readings.items())]
    return Step.model_validate({"round": 1, "recipe": "dataloader", "bottleneck": "input", "trials": trials,
                                "before": {"samples_per_s": before, "peak_memory_bytes": None, "step_time_s": 0.3,
                                           "one_time_s": 0.0}})


def _left(workers: int, readings: dict[int, float | None], band: float = 1.1, handoff_s: float | None = None,
          cpu: float | None = 0.1) -> Leftover:
    final = _summary(workers, readings.get(workers) or 100.0)
    base = _summary(0, 100.0, cpu=cpu, data_s=0.009)
    verdict = diagnose(final, "cpu")
    config = TrainConfig().with_changes({"data.num_workers": workers})
    out = leftover(verdict, 1.03, config, [final, base], [_step(readings)], band, handoff_s)
    assert out is not None
    return out


def test_more_workers_within_the_noise_read_no_faster():
    left = _left(32, {8: 400.0, 16: 800.0, 32: 1600.0, 64: 1570.0, 128: 1500.0})
    assert left.limit is Limit.NO_FASTER
    assert ("the loader stopped at 32 workers: more workers read no faster beyond the noise (64 workers read 0.98x, "
            "128 0.94x of 32's reading; a single reading's noise band here is 1.10x)") in left.why
    assert left.evidence["readings"]["64"] == 1570.0 and left.advice == f"{KNOBS}: {INPUT_IO}"


def test_more_workers_that_could_not_run_are_the_limit():
    left = _left(32, {16: 800.0, 32: 1600.0, 64: None})
    assert left.limit is Limit.FAILED and "64 workers could not run (the trial process killed by signal 9)" in left.why


def test_a_range_that_stopped_growing_below_the_host_s_limit_says_more_is_untested():
    left = _left(16, {4: 400.0, 8: 800.0, 16: 1600.0})
    assert left.limit is Limit.SEARCH and "no larger count was measured" in left.why
    assert "this host allows up to 40): more workers are untested here" in left.why  # 2 per core at 10% CPU


def test_workers_none_of_which_was_kept_say_so():
    left = _left(0, {1: 60.0, 2: 90.0, 4: 95.0})
    assert left.limit is Limit.NO_FASTER
    assert "loader workers were measured up to 4 and none was kept (the best, 4 workers, read 0.95x" in left.why


def test_a_hand_off_that_is_most_of_the_wait_left_is_named():
    left = _left(32, {16: 800.0, 32: 1600.0, 64: 1590.0}, handoff_s=0.004)
    assert "receiving each batch from a worker costs 4.00 ms here, of the 6.00 ms the step still waits" in left.why
    assert "receiving each batch" not in _left(32, {16: 800.0, 32: 1600.0, 64: 1590.0}, handoff_s=0.001).why


def test_each_host_limit_is_its_own_term_and_growth_stops_at_the_least(monkeypatch):
    """1000 open files at 8 per worker; half of 3 GB at 100 MB of RSS each; twice the workers that
    keep the cores busy (a 2-core host) when the loading is CPU work."""
    monkeypatch.setattr(machine, "open_files_limit", lambda: 1000)
    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 3 * 10**9)
    monkeypatch.setattr(machine, "cores", lambda: 2)
    for cpu, want in ((None, {Limit.OPEN_FILES: 125, Limit.MEMORY: 15}),
                      (0.3, {Limit.OPEN_FILES: 125, Limit.MEMORY: 15, Limit.CORES: 14})):
        s = _summary(0, 100.0, cpu=cpu)
        assert machine.worker_limits([s]) == want
        assert machine.growth_limit("data.num_workers", s) == min(want.values())


def test_a_fix_in_the_user_s_code_keeps_its_words():
    sync = Waste(cls=Bottleneck.SYNC, share=0.4, max_gain=1 / 0.6, reason="3.0 host-device syncs per step")
    verdict = Verdict(bottleneck=Bottleneck.SYNC, slowest_stage="forward", wastes=[sync])
    left = leftover(verdict, 1.03, TrainConfig(), [_summary(0, 100.0)], [], 1.1)
    assert left.waste is Bottleneck.SYNC and left.limit is None
    assert words(left).startswith("no recipe left for the sync bottleneck (3.0 host-device syncs per step); in your "
                                  "code: move the host read out of the step")
    assert ("What you can do, in your code", ADVICE[Bottleneck.SYNC]) in stop_lines(
        make_report().model_copy(update={"leftover": left, "stop_reason": words(left)}))


# --- renderers, given a record ----------------------------------------------------------------------------------


def test_a_recorded_leftover_is_shown_in_three_labelled_parts():
    left = Leftover(waste=Bottleneck.INPUT, reason="no recipe left for the input bottleneck (waits 72%)",
                    limit=Limit.OPEN_FILES, why="the loader stopped at 32 workers: the host allows at most 32 workers",
                    advice=f"{KNOBS}: {INPUT_IO}")
    r = make_report().model_copy(update={"leftover": left, "stop_reason": words(left)})
    shown = _shown(r)
    assert "stopped: no recipe left for the input bottleneck (waits 72%) why it stopped there: the loader" in \
        shown["terminal"]
    assert f"what you can do, beyond autotune's knobs: {INPUT_IO}" in shown["terminal"]
    assert "**Why it stopped there:** the loader stopped at 32 workers" in shown["md"]
    assert "<b>What you can do, beyond autotune's knobs:</b> fewer, larger reads per sample" in shown["html"]


def test_a_stop_reason_that_is_not_the_leftover_s_is_shown_as_it_is():
    """An interrupted resume may overwrite the stop reason: the leftover's parts are not shown then."""
    left = Leftover(waste=Bottleneck.INPUT, reason="no recipe left", why="the host allows at most 3",
                    advice=f"{KNOBS}: {INPUT_IO}")
    r = make_report().model_copy(update={"leftover": left, "stop_reason": "interrupted (Ctrl-C): rerun"})
    for where, text in _shown(r).items():
        assert "interrupted (Ctrl-C): rerun" in text and "stopped there" not in text.lower(), where
