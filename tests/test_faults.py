"""Nothing finished is lost, nothing is decided twice: interrupted and disturbed runs,
resumed, reach the undisturbed run's decisions (agent level, on FakeRunner: fast)."""

from __future__ import annotations

import optuna
import pytest

from autotune.agent import Agent, Settings
from autotune.errors import TrialFailed, UserError
from autotune.identity import Resume
from autotune.recipes import load_recipes
from autotune.record import FailureKind
from autotune.testing import FakeRunner

FACTS = {"conv": False, "checkpoint_blocks": True}


def speed(c):
    return 100.0 * (1 + c.data.num_workers) * (1.3 if c.precision.amp == "bf16" else 1.0)


def stages(c):
    return {"data": 0.8, "forward": 0.1, "backward": 0.1} if c.data.num_workers < 4 else \
        {"data": 0.0, "forward": 0.5, "backward": 0.5}


def agent(runner, path, study="s", **settings) -> Agent:
    storage = optuna.storages.RDBStorage(f"sqlite:///{path / 'study.db'}")
    return Agent(runner, load_recipes(), storage, study, Settings(**settings), FACTS)


class Interrupting(FakeRunner):
    """Raises KeyboardInterrupt at its n-th measurement or comparison (counted together)."""

    def __init__(self, at: int, **kw) -> None:
        super().__init__(speed, stages=stages, **kw)
        self.at, self.calls = at, 0

    def _tick(self) -> None:
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt

    def measure(self, config, trace=None, on_window=None, floor=None, until=None):
        self._tick()
        return super().measure(config, trace, on_window, floor, until)

    def interleave(self, a, b, pairs, on_pair=None):
        self._tick()
        return super().interleave(a, b, pairs, on_pair)


@pytest.mark.parametrize("at", [1, 2, 3, 6, 12, 14])  # baseline, A/A, first trial, mid-search, comparisons
def test_an_interrupted_run_resumes_to_the_undisturbed_decisions(tmp_path, at):
    (tmp_path / "ref").mkdir()
    reference = agent(FakeRunner(speed, stages=stages), tmp_path / "ref").run()
    first = agent(Interrupting(at), tmp_path)
    with pytest.raises(KeyboardInterrupt):
        first.run()
    stored = {t.number: t.samples_per_s for s in first.report.steps for t in s.trials}
    again_runner = FakeRunner(speed, stages=stages)
    again = agent(again_runner, tmp_path).run()
    assert again.complete
    # The knobs whose true speeds differ are decided alike (ties among equal ones may fall
    # either way: the noise draws differ after a resume).
    for key in ("data.num_workers", "precision.amp"):
        assert again.final_config[key] == reference.final_config[key], key
    assert {s.recipe for s in again.steps if s.accepted} == {s.recipe for s in reference.steps if s.accepted}
    if first.report.baseline is not None:  # what was measured before the interrupt is reused as it was
        assert again.baseline == first.report.baseline  # noisy draws: a re-measurement would differ
    assert all(stored[n] == v for n, v in stored.items())


def test_a_failed_comparison_is_not_remembered(tmp_path):
    class FailingOnce(FakeRunner):
        def interleave(self, a, b, pairs, on_pair=None):
            raise TrialFailed(FailureKind.TIMEOUT, "a transient hang")

    with pytest.raises(UserError, match="a transient hang"):
        agent(FailingOnce(speed, stages=stages), tmp_path).run()
    r = agent(FakeRunner(speed, stages=stages), tmp_path).run()  # the next run measures it again
    assert r.complete and r.noise is not None and r.noise.pairs > 0


def test_a_changed_run_gets_a_study_of_its_own_and_strict_refuses(tmp_path):
    agent(FakeRunner(speed, stages=stages, batch_size=32), tmp_path).run()
    same = FakeRunner(speed, stages=stages, batch_size=32)
    assert agent(same, tmp_path).run().study.name == "s" and same.measured == []  # same fingerprint: resumed
    other = agent(FakeRunner(speed, stages=stages, batch_size=16), tmp_path)
    assert other.study != "s" and "batch_size: 32 -> 16" in other.study_note
    r = other.run()
    assert r.study.name == other.study and r.study.note == other.study_note
    with pytest.raises(UserError, match="batch_size: 32 -> 16"):
        agent(FakeRunner(speed, stages=stages, batch_size=16), tmp_path, resume=Resume.STRICT)
    fresh = agent(FakeRunner(speed, stages=stages, batch_size=32), tmp_path, resume=Resume.NEW)
    assert fresh.study.startswith("s-")


def test_a_live_lease_on_the_study_refuses_a_second_run(tmp_path):
    import json
    import socket

    first = agent(FakeRunner(speed, stages=stages), tmp_path)
    ledger = optuna.create_study(study_name=first.study, storage=first.storage, load_if_exists=True)
    import os
    import subprocess
    import sys
    import time

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ledger.set_user_attr("lease", {"host": socket.gethostname(), "pid": holder.pid, "since": time.time(),
                                       "renewed": time.time()})
        with pytest.raises(UserError, match=f"pid {holder.pid}"):
            first.run()
    finally:
        holder.kill()
        holder.wait()
    assert first.run().complete  # its holder is gone: the lease is taken over
    assert json.dumps(ledger.user_attrs.get("lease")) == "null"
    assert os.getpid()


def test_a_full_disk_while_writing_reports_leaves_the_previous_ones_intact(tmp_path, monkeypatch):
    import errno
    import os

    from autotune.report import write_outputs

    report = agent(FakeRunner(speed, stages=stages), tmp_path).run()
    out = tmp_path / "out"
    write_outputs(report, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    changed = report.model_copy(update={"stop_reason": "a newer run"})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(UserError, match="No space left on device.*rerun the same command"):
        write_outputs(changed, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "no file changed, no temporary file left"
