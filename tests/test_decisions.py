"""The agent decides like an engineer: ranked wastes, shares within noise that do not flip,
compute recipes still tried after a small data wait tops the list, ranges that grow, a
joint memory search that takes the fastest fit, and candidates compared side by side
when the search cannot tell them from a lucky incumbent. All on `FakeRunner`."""

from __future__ import annotations

import itertools
import math

import optuna
import pytest

from autotune import machine
from autotune.agent import Agent, Settings
from autotune.context import Context
from autotune.diagnose import diagnose
from autotune.recipes import load_recipes
from autotune.report.fmt import fmt_ratio
from autotune.report.html import render_html
from autotune.report.markdown import render_markdown
from autotune.report.tables import noise_text, noise_warning
from autotune.report.terminal import print_tune_summary
from autotune.record import Bottleneck, Signals, StageTime, StepTime, Summary, TrialState
from autotune.testing import FakeRunner
from autotune.workload import with_world_size

FACTS = {"conv": False, "checkpoint_blocks": True}


def run_agent(runner, tmp_path, **settings):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    return Agent(runner, load_recipes(), storage, "s", Settings(**settings), FACTS).run()


def summary(window_data_shares: list[float]) -> Summary:
    windows = [{"data": d, "forward": (1 - d) * 0.45, "backward": (1 - d) * 0.45, "optimizer": (1 - d) * 0.1}
               for d in window_data_shares]
    mean = sum(window_data_shares) / len(window_data_shares)
    return Summary(config={}, step_time_s=StepTime(median=0.01, p90=0.011, mean=0.01), samples_per_s=100.0,
                   windows_samples_per_s=[100.0] * len(windows), window_cv=0.0,
                   stages={"data": StageTime(s=0.01 * mean, share=mean),
                           "forward": StageTime(s=0.0045 * (1 - mean), share=(1 - mean) * 0.45),
                           "backward": StageTime(s=0.0045 * (1 - mean), share=(1 - mean) * 0.45),
                           "optimizer": StageTime(s=0.001 * (1 - mean), share=(1 - mean) * 0.1)},
                   window_stage_shares=windows, signals=Signals(ops_per_step=10, mean_op_us=500.0))


def test_wastes_are_ranked_with_their_amdahl_bound():
    v = diagnose(summary([0.30, 0.32, 0.31]), "cpu")
    assert v.bottleneck is Bottleneck.COMPUTE  # the model's own work holds 69% of the step
    assert [w.cls for w in v.wastes] == [Bottleneck.INPUT, Bottleneck.COMPUTE]
    top = v.wastes[0]
    assert abs(top.max_gain - 1 / (1 - top.share)) < 1e-9
    assert v.model_dump(mode="json")["wastes"][0]["class"] == "input"


def test_a_share_within_noise_of_its_line_does_not_flip():
    borderline = summary([0.035, 0.052, 0.061, 0.044, 0.058])  # mean 5.0%, interval straddles 5%
    clear = summary([0.30, 0.31, 0.29])
    calm = summary([0.01, 0.012, 0.011])
    was_compute, was_input = diagnose(calm, "cpu"), diagnose(clear, "cpu")
    def fired(v):
        return Bottleneck.INPUT in [w.cls for w in v.wastes]

    assert not fired(diagnose(borderline, "cpu", previous=was_compute))
    assert fired(diagnose(borderline, "cpu", previous=was_input))
    w = diagnose(borderline, "cpu", previous=was_input).waste(Bottleneck.INPUT)
    assert w.evidence["borderline"] is True
    # clearly above or below the line, the previous verdict does not matter
    assert fired(diagnose(clear, "cpu", previous=was_compute))
    assert not fired(diagnose(calm, "cpu", previous=was_input))


def test_compile_is_still_tried_after_a_small_data_wait_tops_the_list(tmp_path):
    """A wide MLP: 95% compute; bf16 helps, and afterwards the data wait reads just over
    5%. The loader cannot gain what the noise can see; compile still gets its round."""

    def speed(c):
        return 100.0 * (1.3 if c.precision.amp == "bf16" else 1.0) * (1.25 if c.compile.mode != "none" else 1.0)

    def stages(c):
        data = 0.0504 if c.precision.amp == "bf16" else 0.045
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) * 0.4, "optimizer": (1 - data) * 0.1}

    r = run_agent(FakeRunner(speed, stages=stages, noise=0.01), tmp_path)
    recipes = [s.recipe for s in r.steps]
    assert "compile" in recipes and "amp" in recipes, recipes
    assert recipes.index("amp") < recipes.index("compile")
    assert r.final_config["precision.amp"] == "bf16" and r.final_config["compile.mode"] != "none"
    # what is left is a 5% wait the loader could not remove: said as such, not as "acceptable"
    assert "compute-bound" in r.stop_reason or "budget" in r.stop_reason or \
        r.stop_reason.startswith("no recipe left for the input bottleneck"), r.stop_reason


def test_a_range_whose_best_trial_sits_at_its_top_grows(tmp_path):
    """Remote-store latency: every worker adds throughput, far past the core count."""

    def speed(c):
        return 100.0 * (1 + c.data.num_workers)

    def stages(c):
        return {"data": 0.9, "forward": 0.05, "backward": 0.05} if c.data.num_workers < 40 else \
            {"data": 0.0, "forward": 0.5, "backward": 0.5}

    runner = FakeRunner(speed, stages=stages)
    top = max(load_recipes()[0].space("cpu", machine.cores(), 32)["data.num_workers"])
    r = run_agent(runner, tmp_path)
    step = r.steps[0]
    assert step.recipe == "dataloader" and step.accepted
    assert step.grown and "grown to" in step.grown[0]
    assert r.final_config["data.num_workers"] > top


def test_one_low_reading_at_the_top_of_the_range_does_not_close_it(tmp_path):
    """Remote-store latency again, but the top rung's one reading comes out 40% low (a
    noisy window): the best trial sits just below the top and the step still waits for
    data, so the range grows from the best trial all the same."""
    top = max(load_recipes()[0].space("cpu", machine.cores(), 32)["data.num_workers"])

    class Unlucky(FakeRunner):
        def measure(self, config, trace=None, on_window=None, floor=None, until=None):
            s = super().measure(config, trace, on_window, floor, until)
            if config.data.num_workers == top:
                return s.model_copy(update={"samples_per_s": s.samples_per_s * 0.6})
            return s

    def speed(c):
        return 100.0 * (1 + c.data.num_workers)

    def stages(c):
        return {"data": 0.9, "forward": 0.05, "backward": 0.05} if c.data.num_workers < 40 else \
            {"data": 0.0, "forward": 0.5, "backward": 0.5}

    r = run_agent(Unlucky(speed, stages=stages), tmp_path)
    step = r.steps[0]
    tried = [t.config["data.num_workers"] for t in step.trials]
    assert top in tried and max(t for t in tried if t <= top) == top, tried
    assert step.recipe == "dataloader" and step.accepted
    assert step.grown and "top octave" in step.grown[0], step.grown
    assert r.final_config["data.num_workers"] > top


def test_the_loaders_other_knobs_are_tried_from_its_best_rung_when_it_reads_within_noise_of_the_incumbent(tmp_path):
    """Workers alone gain nothing here: each window is a new epoch and non-persistent
    workers start again at every one (decode_bound's rungs read 0.93 of a baseline that
    had read high). Persistent workers are what helps, and only with workers: tried from
    the incumbent's 0 workers they change nothing, so they must be tried from the best
    rung, which read within the noise of the incumbent, not from the incumbent."""

    def speed(c):  # CPU-bound decoding on 2 cores: past 2 workers they fight the step for the cores
        w = c.data.num_workers
        return 100.0 * {0: 1.0, 1: 0.8, 2: 0.97, 3: 0.95}.get(w, 0.6) * (1.3 if w and c.data.persistent_workers else 1.0)

    def stages(c):
        return {"data": 0.5, "forward": 0.25, "backward": 0.25} if speed(c) < 110 else \
            {"data": 0.02, "forward": 0.49, "backward": 0.49}

    runner = FakeRunner(speed, stages=stages, noise=0.01)
    r = run_agent(runner, tmp_path, only=("dataloader",))
    step = r.steps[0]
    assert any(t.config["data.persistent_workers"] and t.config["data.num_workers"] for t in step.trials), \
        [t.changes for t in step.trials]
    assert step.accepted, step.reason
    assert r.final_config["data.persistent_workers"] and r.final_config["data.num_workers"] > 0


def test_a_grown_range_keeps_the_best_configs_other_knobs(tmp_path):
    """Remote-store latency: more workers keep helping past the range (the top rung read a
    dip), and persistent workers add a little. The best trial (6 persistent workers) is not
    at the top, whose plain config read within the noise of it and shows the range too
    small; the range grows from the best config, persistent workers and all."""
    top = max(load_recipes()[0].space("cpu", machine.cores(), 32)["data.num_workers"])

    def speed(c):
        w = c.data.num_workers
        return (700.0 if w == top else 100.0 * (1 + w)) * (1.04 if w and c.data.persistent_workers else 1.0)

    def stages(c):
        return {"data": 0.9, "forward": 0.05, "backward": 0.05} if c.data.num_workers < 40 else \
            {"data": 0.0, "forward": 0.5, "backward": 0.5}

    r = run_agent(FakeRunner(speed, stages=stages, noise=0.01), tmp_path, only=("dataloader",))
    step = r.steps[0]
    grown = [t for t in step.trials if t.config["data.num_workers"] > top]
    assert step.grown and grown, (step.grown, [t.changes for t in step.trials])
    assert all(t.config["data.persistent_workers"] for t in grown), [t.changes for t in grown]
    assert r.final_config["data.num_workers"] > top and r.final_config["data.persistent_workers"]


def test_the_memory_search_takes_the_fastest_fit_not_the_first(tmp_path):
    """bf16 alone does not fit; micro-batching or checkpointing alone fit but cost speed;
    bf16 with a moderate micro-batch fits and is the fastest."""

    def memory(c):
        mem = 190.0 * (0.7 if c.precision.amp != "none" else 1.0)
        mem *= (c.memory.micro_batch_size or 32) / 32 if c.memory.micro_batch_size else 1.0
        return int(mem * (0.45 if c.memory.activation_checkpointing else 1.0))

    def speed(c):
        s = 100.0 * (1.3 if c.precision.amp == "bf16" else 1.0)
        s *= {None: 1.0, 32: 1.0, 16: 0.95, 8: 0.85, 4: 0.7, 2: 0.5, 1: 0.3}[c.memory.micro_batch_size]
        return s * (0.8 if c.memory.activation_checkpointing else 1.0)

    runner = FakeRunner(speed, memory=memory, noise=0.01, stages=lambda c: {"forward": 0.5, "backward": 0.5})
    r = run_agent(runner, tmp_path, memory_limit=100)
    step = r.steps[0]
    assert step.recipe == "memory-joint" and step.accepted, (step.recipe, step.reason)
    fits = [t for t in step.trials if t.state is TrialState.OK]
    fastest = max(fits, key=lambda t: t.samples_per_s)
    assert step.after_config == fastest.config
    assert fits[0].samples_per_s < fastest.samples_per_s, "the first fit is not the one taken"
    assert r.final.peak_memory_bytes <= 100
    assert r.final_config["precision.amp"] == "bf16"
    assert all(t.changes for t in step.trials), "the config over the limit is not measured again"


class _Swinging(FakeRunner):
    """A single reading's windows swing by `swing` in turn (averaging out over a reading),
    while side-by-side pairs share the machine's state: readings stay true, comparisons
    stay sharp, and the noise band (what one reading's windows say) widens."""

    def __init__(self, *args, swing: float = 1.0, **kw):
        super().__init__(*args, **kw)
        self.swing, self.paired = swing, False

    def draw(self, config):
        s = 1.0 if self.paired else (self.swing if self.windows_taken % 2 else 1 / self.swing)
        return super().draw(config) * s

    def interleave(self, a, b, pairs, on_pair=None):
        self.paired = True
        try:
            return super().interleave(a, b, pairs, on_pair)
        finally:
            self.paired = False


@pytest.mark.parametrize("noise", ["quiet", "swing", "aa"])
def test_the_fastest_fit_of_two_knobs_neither_of_which_fits_alone_is_found_in_few_trials(tmp_path, noise):
    """bf16 alone and half the batch alone are both over the limit; together they fit and
    are the fastest fit of the whole space. The search measures each knob alone, predicts
    the combinations, and reaches that fit in a few trials, not by walking the space; on
    a machine whose windows swing (a wide band) or whose A/A reads 1.2x every time (a wide
    margin) too: the predictions stop it, not the band or the margin."""
    import itertools

    from autotune.config import TrainConfig

    def memory(c):
        mem = 190.0 * (0.65 if c.precision.amp != "none" else 1.0)
        mem *= {None: 1.0, 16: 0.6, 8: 0.4, 4: 0.3, 2: 0.25}[c.memory.micro_batch_size]
        return int(mem * (0.5 if c.memory.activation_checkpointing else 1.0))

    def speed(c):
        s = 100.0 * (1.4 if c.precision.amp == "bf16" else 1.0)
        s *= {None: 1.0, 16: 0.97, 8: 0.8, 4: 0.6, 2: 0.4}[c.memory.micro_batch_size]
        return s * (0.75 if c.memory.activation_checkpointing else 1.0)

    space = itertools.product(["none", "bf16", "fp16"], [None, 16, 8, 4, 2], [False, True])
    configs = [TrainConfig().with_changes({"precision.amp": a, "memory.micro_batch_size": m,
                                           "memory.activation_checkpointing": k}) for a, m, k in space]
    truth = max((c for c in configs if memory(c) <= 100), key=speed)
    assert memory(TrainConfig().with_changes({"precision.amp": "bf16"})) > 100
    assert memory(TrainConfig().with_changes({"memory.micro_batch_size": 16})) > 100
    kw = {"memory": memory, "noise": 0.01, "stages": lambda c: {"forward": 0.5, "backward": 0.5}}
    runner = (_DisturbedAA(speed, disturbed=3, factor=1.2, **kw) if noise == "aa" else
              _Swinging(speed, swing=1.4 if noise == "swing" else 1.0, **kw))
    r = run_agent(runner, tmp_path, memory_limit=100)
    assert (r.noise.band > 1.15) == (noise != "quiet") and (r.noise.margin > 1.15) == (noise == "aa"), r.noise
    step = r.steps[0]
    assert step.recipe == "memory-joint" and step.accepted, (step.recipe, step.reason)
    knobs = ("precision.amp", "memory.micro_batch_size", "memory.activation_checkpointing")
    assert [truth.get(k) for k in knobs] == ["bf16", 16, False]
    assert len(step.trials) <= 5, [t.changes for t in step.trials]
    assert r.final.peak_memory_bytes <= 100
    assert [step.after_config[k] for k in knobs] == [truth.get(k) for k in knobs], step.after_config
    assert all(t.changes for t in step.trials), "the config over the limit is not measured again"


def _memory_joint(tmp_path, speed, memory):
    """The joint memory search under a 100-byte limit on a FakeRunner with bf16 units: the
    report, its accepted memory-joint step, and each trial's (precision, micro-batch,
    checkpointing)."""
    runner = FakeRunner(speed, memory=memory, noise=0.01, stages=lambda c: {"forward": 0.5, "backward": 0.5},
                        lowp={"bf16": 1.5})
    r = run_agent(runner, tmp_path, memory_limit=100)
    step = r.steps[0]
    assert step.recipe == "memory-joint" and step.accepted, (step.recipe, step.reason)
    return r, step, [(t.config["precision.amp"], t.config["memory.micro_batch_size"],
                      t.config["memory.activation_checkpointing"]) for t in step.trials]


def test_a_combination_predicted_just_under_the_fastest_fit_is_measured_once(tmp_path):
    """bf16 alone and half the batch alone each read 0.85 of the baseline (over the limit);
    checkpointing alone fits at 0.74. Their product, 0.72, is under checkpointing's reading
    but within the noise of it, and the pair truly runs 1.07x the baseline (the benchmark's
    memory case on a Zen 4 kept checkpointing at 0.77 of the fastest fit): measured once
    past the stop, and kept."""

    def memory(c):
        mem = 190.0 * (0.6 if c.precision.amp == "bf16" else 1.0) * (0.6 if c.memory.micro_batch_size else 1.0)
        return int(mem * (0.5 if c.memory.activation_checkpointing else 1.0))

    def speed(c):
        bf16, mb, ckpt = c.precision.amp == "bf16", c.memory.micro_batch_size, c.memory.activation_checkpointing
        s = 100.0 * (1.07 if bf16 and mb else 0.85 if bf16 or mb else 1.0)
        return s * (0.74 if ckpt else 1.0)

    r, step, _ = _memory_joint(tmp_path, speed, memory)
    assert r.final_config["precision.amp"] == "bf16" and r.final_config["memory.micro_batch_size"], \
        [t.changes for t in step.trials]
    assert not r.final_config["memory.activation_checkpointing"]
    assert len(step.trials) <= 5, [t.changes for t in step.trials]


def test_a_pair_predicted_from_an_unlucky_single_reading_still_gets_its_one_look(tmp_path):
    """The benchmark's memory case on a Zen 4 (a band of 1.5): bf16 alone and half the
    batch alone are over the limit, checkpointing alone fits. Half the batch's one reading
    came out at 0.55 of its truth, so bf16 with half the batch (truly the fastest fit,
    1.36 x 1.05) was predicted at 0.8 of the baseline, under bf16 with checkpointing's
    reading (1.2) by more than the band. A product of two single readings strays by up to
    the band squared: it still gets its one look past the stop, and is kept."""

    class Unlucky(_Swinging):
        def measure(self, config, trace=None, on_window=None, floor=None, until=None):
            s = super().measure(config, trace, on_window, floor, until)
            if config.memory.micro_batch_size and config.precision.amp == "none" \
                    and not config.memory.activation_checkpointing:
                return s.model_copy(update={"samples_per_s": s.samples_per_s * 0.55})
            return s

    def memory(c):
        mem = 190.0 * (0.6 if c.precision.amp == "bf16" else 1.0) * (0.6 if c.memory.micro_batch_size else 1.0)
        return int(mem * (0.5 if c.memory.activation_checkpointing else 1.0))

    def speed(c):
        bf16, mb, ckpt = c.precision.amp == "bf16", c.memory.micro_batch_size, c.memory.activation_checkpointing
        return 100.0 * (1.36 if bf16 else 1.0) * (1.05 if mb else 1.0) * (0.88 if ckpt else 1.0)

    runner = Unlucky(speed, memory=memory, noise=0.01, stages=lambda c: {"forward": 0.5, "backward": 0.5},
                     lowp={"bf16": 1.5}, swing=1.4)
    r = run_agent(runner, tmp_path, memory_limit=100)
    step = r.steps[0]
    assert step.recipe == "memory-joint" and step.accepted, (step.recipe, step.reason)
    assert r.noise.band > 1.25, r.noise.band
    tried = [(t.config["precision.amp"], t.config["memory.micro_batch_size"],
              t.config["memory.activation_checkpointing"]) for t in step.trials]
    assert len(tried) <= 5, tried
    assert (step.after_config["precision.amp"], step.after_config["memory.activation_checkpointing"]) == \
        ("bf16", False) and step.after_config["memory.micro_batch_size"], tried


def test_a_smaller_micro_batch_without_the_precision_of_a_fit_is_not_measured(tmp_path, monkeypatch):
    """The benchmark's memory case on a Zen 4 (a band of 1.5): bf16 with half the batch fits
    (1.17x, under its forecast), then bf16 with checkpointing (1.27x). A quarter of the batch
    alone, predicted at 0.92x from half the batch's reading, is within the band of the
    fastest fit, but it is the first fit without bf16 (which read 1.3x alone) and with a
    smaller micro-batch: it can only be slower, and is not measured (s27 measured it as its
    sixth trial of the grid's 20)."""
    monkeypatch.setattr(Context, "band", property(lambda self: 1.5))

    def memory(c):
        mem = 190.0 * (0.6 if c.precision.amp == "bf16" else 1.0)
        mem *= {None: 1.0, 16: 0.6, 8: 0.4, 4: 0.3, 2: 0.25}[c.memory.micro_batch_size]
        return int(mem * (0.5 if c.memory.activation_checkpointing else 1.0))

    def speed(c):
        bf16, mb, ckpt = c.precision.amp == "bf16", c.memory.micro_batch_size, c.memory.activation_checkpointing
        s = 100.0 * (1.3 if bf16 else 1.0) * {None: 1.0, 16: 0.97, 8: 0.9, 4: 0.7, 2: 0.5}[mb]
        s *= (0.98 if bf16 else 0.93) if ckpt else 1.0
        return s * (0.93 if bf16 and mb else 1.0)

    r, step, tried = _memory_joint(tmp_path, speed, memory)
    assert ("bf16", 16, False) in tried and ("bf16", None, True) in tried, tried
    assert [m for a, m, k in tried if a == "none" and not k] == [16], tried  # no smaller micro-batch alone
    assert len(tried) <= 5, tried
    assert (step.after_config["precision.amp"], step.after_config["memory.activation_checkpointing"]) == \
        ("bf16", True), tried


def test_a_micro_batch_is_measured_once_and_a_flattered_pair_of_knobs_is_not_walked(tmp_path):
    """The benchmark's memory case on a Zen 4, in miniature: bf16 alone, half the batch
    alone and checkpointing alone each read their factors; bf16 with half the batch reads
    only 0.8 of what their product promised. The smaller micro-batches are predicted from
    the one reading (none is walked down to), and the pair's shortfall lowers the
    prediction of bf16 with half the batch and checkpointing, which is then not measured:
    bf16 with checkpointing, the fastest fit, is found in five trials."""

    def memory(c):
        mb = c.memory.micro_batch_size or 32
        mem = 190.0 * (0.61 if c.precision.amp == "bf16" else 1.0) * (0.24 + 0.76 * mb / 32)
        return int(mem * (0.52 if c.memory.activation_checkpointing else 1.0))

    def speed(c):
        bf16, mb, ckpt = c.precision.amp == "bf16", c.memory.micro_batch_size, c.memory.activation_checkpointing
        s = 100.0 * (1.36 if bf16 else 1.0) * {None: 1.0, 16: 1.05, 8: 0.9, 4: 0.7, 2: 0.5}[mb]
        s *= 0.88 if ckpt else 1.0
        return s * (0.8 if bf16 and mb else 1.0) * (0.6 if mb and ckpt else 1.0)

    r, step, tried = _memory_joint(tmp_path, speed, memory)
    assert [m for a, m, k in tried if a == "none" and not k] == [16], tried  # one micro-batch alone
    assert ("bf16", 16, True) not in tried, tried
    assert len(tried) <= 5, tried
    assert (step.after_config["precision.amp"], step.after_config["memory.micro_batch_size"],
            step.after_config["memory.activation_checkpointing"]) == ("bf16", None, True)


def test_a_candidate_within_noise_of_a_lucky_incumbent_is_compared(tmp_path):
    """The baseline's single measurement reads 46% high; compile's true gain (1.2x) reads
    as a loss against it, but the incumbent's estimate pools the A/A's readings too, so
    compile comes within the noise band and its interleaved comparison runs."""

    class Lucky(FakeRunner):
        was_lucky = False

        def measure(self, config, trace=None, on_window=None, floor=None, until=None):
            s = super().measure(config, trace, on_window, floor, until)
            if len(self.measured) == 1:  # the baseline
                assert config.compile.mode == "none"
                self.was_lucky = True
                return s.model_copy(update={"samples_per_s": s.samples_per_s * 1.46})
            return s

    def speed(c):
        return 100.0 * (1.2 if c.compile.mode != "none" else 1.0)

    runner = Lucky(speed, noise=0.01, stages=lambda c: {"forward": 0.5, "backward": 0.5})
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    r = Agent(runner, load_recipes(), storage, "s", Settings(only=("compile",)), FACTS).run()
    step = r.steps[0]
    assert runner.was_lucky
    assert step.recipe == "compile" and step.accepted, step.reason
    assert any(b["compile.mode"] != "none" for _, b in runner.interleaved)
    assert all(t.samples_per_s < r.baseline.samples_per_s for t in step.trials), "every compile trial read lower"
    assert all(t.changes for t in step.trials), "the incumbent is not measured again in the round"


def test_a_lucky_start_with_a_tight_a_a_still_compares_a_candidate_its_windows_cannot_tell_apart(tmp_path):
    """The baseline and the A/A both run in a fast spell (1.35x); a reading's windows swing
    by 25% while side-by-side pairs share the machine's state (so the A/A's interval is
    tight). compile's true 1.2x reads 0.9x of the incumbent's pooled estimate: beyond the
    A/A's width, within what the baseline's own windows say one reading can stray, so it
    is compared side by side, and kept."""

    class LuckyStart(_Swinging):
        fast = True

        def draw(self, config):
            return super().draw(config) * (1.35 if self.fast else 1.0)

        def measure(self, config, trace=None, on_window=None, floor=None, until=None):
            if config.compile.mode != "none":
                self.fast = False  # the spell ends as the search starts
            return super().measure(config, trace, on_window, floor, until)

    def speed(c):
        return 100.0 * (1.2 if c.compile.mode != "none" else 1.0)

    runner = LuckyStart(speed, noise=0.005, stages=lambda c: {"forward": 0.5, "backward": 0.5}, swing=1.25)
    r = run_agent(runner, tmp_path, only=("compile",))
    step = r.steps[0]
    assert r.noise.high / r.noise.low < 1.05, "the A/A is tight"
    assert all(t.samples_per_s < r.baseline.samples_per_s / 1.05 for t in step.trials), "every trial read low"
    assert any(b["compile.mode"] != "none" for _, b in runner.interleaved), step.reason
    assert step.recipe == "compile" and step.accepted, step.reason


def test_a_range_grows_only_up_to_the_hosts_limit_and_says_so_once(tmp_path, monkeypatch):
    def speed(c):
        return 100.0 * (1 + c.data.num_workers)

    monkeypatch.setattr(machine, "growth_limit", lambda key, summary: 20)
    r = run_agent(FakeRunner(speed, stages=lambda c: {"data": 0.9, "forward": 0.05, "backward": 0.05}), tmp_path)
    step = r.steps[0]
    assert r.final_config["data.num_workers"] == 20
    assert sum("range not grown" in note for note in step.grown) == 1, step.grown


def _loader_run(tmp_path, monkeypatch, cpu_share: float):
    """Workers keep helping up to 8 by throughput alone; the loading thread's CPU share at
    0 workers (measured only there) says whether that can hold on this 2-core host."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        return 100.0 * (1 + min(c.data.num_workers, 8))

    runner = FakeRunner(speed, noise=0.005, stages=lambda c: {"data": 0.8, "forward": 0.1, "backward": 0.1},
                        signals=lambda c: {} if c.data.num_workers else {"data_cpu_share": cpu_share})
    return run_agent(runner, tmp_path, only=("dataloader",))


def test_cpu_bound_loading_is_not_climbed_past_twice_the_cores(tmp_path, monkeypatch):
    r = _loader_run(tmp_path, monkeypatch, cpu_share=1.0)
    step = r.steps[0]
    workers = {t.config["data.num_workers"] for t in step.trials}
    assert max(workers) == 4, workers  # 2 x 2 cores / 1.0: no trial of 6, 8 or more
    assert any("range not grown" in note for note in step.grown), step.grown
    assert "loading is CPU work (100% of the wait)" in r.initial_diagnosis.wastes[0].reason


def test_loading_that_waits_still_climbs_and_grows(tmp_path, monkeypatch):
    r = _loader_run(tmp_path, monkeypatch, cpu_share=0.05)
    workers = {t.config["data.num_workers"] for t in r.steps[0].trials}
    assert 8 in workers and max(workers) > 8, workers  # the ladder's top, then grown (the range stops at 8)


def test_a_noisy_machine_still_tries_every_compute_recipe_but_not_an_immaterial_wait():
    """Under load the A/A margin reads high (1.67 was seen): a prior below it must not
    drop a compute recipe (only the measurement can say what it gains here), while a data
    wait whose whole removal could not clear the margin is not worth the loader's trials."""
    from autotune.plan import Attempts, rank

    verdict = diagnose(summary([0.05, 0.05, 0.05]), "cpu")
    chosen = [c.recipe.name for c in rank(load_recipes(), verdict, "cpu", FACTS, Attempts(), margin=1.668)]
    assert "optimizer-impl" in chosen and "compile" in chosen and "amp" in chosen, chosen
    assert "dataloader" not in chosen
    # a wait worth more than the margin is searched, and before the costlier compute recipes
    heavy = diagnose(summary([0.5, 0.5, 0.5]), "cpu")
    chosen = [c.recipe.name for c in rank(load_recipes(), heavy, "cpu", FACTS, Attempts(), margin=1.668)]
    assert chosen[0] == "dataloader", chosen


class _DisturbedAA(FakeRunner):
    """The first `disturbed` A/As (identical configs side by side) read B `factor` times A
    as the agent sees them: a neighbour's burst during one side's windows. (The agent opens
    the other side first every other comparison, the A/As being its first: the second
    A/A's B comes back first.)"""

    def __init__(self, *args, disturbed: int, factor: float, **kw):
        super().__init__(*args, **kw)
        self.disturbed, self.factor, self.aas = disturbed, factor, 0

    def interleave(self, a, b, pairs, on_pair=None):
        xs, ys = super().interleave(a, b, pairs, on_pair)
        if a == b:
            self.aas += 1
            if self.aas <= self.disturbed:
                if self.aas % 2:
                    ys = [y * self.factor for y in ys]
                else:
                    xs = [x * self.factor for x in xs]
        return xs, ys


def _speed(c):
    return 100.0 * (1.3 if c.compile.mode != "none" else 1.0)


def test_one_disturbed_aa_is_outvoted_and_a_real_gain_is_still_kept(tmp_path):
    runner = _DisturbedAA(_speed, noise=0.01, disturbed=1, factor=1.67)
    r = run_agent(runner, tmp_path, only=("compile",))
    assert runner.aas == 3 and len(r.noise.readings) == 3
    assert r.noise.readings[0].ratio > 1.6 and r.noise.margin < 1.1
    assert r.noise.pairs == 2 * runner.protocol.windows  # the two nearest 1, pooled
    assert r.final_config["compile.mode"] != "none"
    assert "a third was measured" in noise_text(r)


def test_a_difference_the_aas_repeat_widens_the_noise_and_a_real_gain_needs_more_looks(tmp_path):
    """Three A/As read 1.4x: one look of a real 1.3x gain cannot be told from that; the looks
    that follow agree with each other, and the gain is kept on them."""
    runner = _DisturbedAA(_speed, noise=0.01, disturbed=3, factor=1.4)
    r = run_agent(runner, tmp_path, only=("compile",))
    assert len(r.noise.readings) == 3 and r.noise.margin > 1.35
    kept = next(s for s in r.steps if s.accepted)
    assert r.final_config["compile.mode"] != "none", kept.reason
    assert int(kept.reason.split(" look")[0].rsplit(" ", 1)[1]) > 2, kept.reason


def test_a_wide_aa_whose_interval_holds_one_is_measured_again_before_it_sets_the_margin(tmp_path):
    """The first A/A reads 1.22x with windows noisy enough that its interval still holds 1:
    plausible by its interval, but its ratio alone would make the run's margin 1.22 and a
    real 1.2x gain could not clear it. Measured twice more, the median is kept."""

    class WideFirst(_DisturbedAA):
        def interleave(self, a, b, pairs, on_pair=None):
            xs, ys = super().interleave(a, b, pairs, on_pair)
            if a == b and self.aas == 1:  # pairs 1.82x, 0.90x, 1.35x, 1.0x apart: 1.22x, 1 inside
                ys = [x * math.exp(d) for x, d in zip(xs, itertools.cycle([0.6, -0.1, 0.3, 0.0]))]
            return xs, ys

    def speed(c):
        return 100.0 * (1.2 if c.compile.mode != "none" else 1.0)

    runner = WideFirst(speed, noise=0.01, disturbed=0, factor=1.0)
    r = run_agent(runner, tmp_path, only=("compile",))
    first = r.noise.readings[0]
    assert first.ratio > 1.06 and first.low <= 1.0 <= first.high, first
    assert runner.aas == 3 and r.noise.margin < 1.06
    assert r.final_config["compile.mode"] != "none"


def test_two_plausible_aas_are_pooled_and_not_measured_a_third_time(tmp_path):
    runner = _DisturbedAA(_speed, noise=0.01, disturbed=0, factor=1.0)
    r = run_agent(runner, tmp_path, only=("compile",))
    assert runner.aas == 2 and len(r.noise.readings) == 2 and r.noise.pairs == 2 * runner.protocol.windows
    assert "Two A/As" in noise_text(r)
    assert noise_warning(r) is None and "Noisy measurements" not in render_markdown(r)


def test_the_aas_pooled_leave_a_side_opened_second_no_margin_and_it_accepts_no_placebo(tmp_path):
    """Whichever config is opened second reads 8% faster (placement), and the agent opens
    the other side first every other comparison: the two A/As read 1.08 and 1/1.08 and
    pool to 1, so the margin stays near its floor; a placebo's first look and its fresh one
    read the bias in opposite directions, and it is not kept."""

    class SecondFaster(FakeRunner):
        def interleave(self, a, b, pairs, on_pair=None):
            xs, ys = super().interleave(a, b, pairs, on_pair)
            return xs, [y * 1.08 for y in ys]

    from benchmarks.placebo import placebo_recipe
    import torch

    runner = SecondFaster(lambda c: 100.0, noise=0.01)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    r = Agent(runner, [placebo_recipe(torch.device("cpu"))], storage, "s", Settings(), FACTS).run()
    low, high = sorted(m.ratio for m in r.noise.readings)
    assert abs(low * 1.08 - 1) < 0.02 and abs(high / 1.08 - 1) < 0.02, r.noise.readings
    assert r.noise.margin < 1.05
    assert r.steps and not any(s.accepted for s in r.steps), [s.reason for s in r.steps]


def test_a_recipe_is_revisited_once_with_half_its_trials_when_its_waste_returns(tmp_path):
    """More workers remove an 80% data wait; bf16 then halves the compute and the wait is
    back (20% of the step): the loader gets a second, shorter round, and no third."""

    def speed(c):
        workers = c.data.num_workers
        return 100.0 * ((1.5 - 0.01 * workers) if workers >= 2 else 1.0) * (1.4 if c.precision.amp == "bf16" else 1.0)

    def stages(c):
        data = 0.8 if c.data.num_workers < 2 else (0.2 if c.precision.amp == "bf16" else 0.02)
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) * 0.4, "optimizer": (1 - data) * 0.1}

    r = run_agent(FakeRunner(speed, stages=stages, noise=0.01), tmp_path, only=("dataloader", "amp"))
    rounds = [s for s in r.steps if s.recipe == "dataloader"]
    assert [s.recipe for s in r.steps][:3] == ["dataloader", "amp", "dataloader"], [s.recipe for s in r.steps]
    assert len(rounds) == 2 and rounds[0].accepted
    loader = next(x for x in load_recipes() if x.name == "dataloader")
    assert len(rounds[0].trials) > len(rounds[1].trials) <= max(3, loader.trials // 2) + 2  # + a grown range's


def test_a_repeat_that_fails_keeps_the_first_aa_and_says_so(tmp_path):
    from autotune.errors import TrialFailed
    from autotune.record import FailureKind

    class FailingRepeat(_DisturbedAA):
        def interleave(self, a, b, pairs, on_pair=None):
            if a == b and self.aas == 1:  # the second A/A
                self.aas += 1
                raise TrialFailed(FailureKind.CRASH, "the repeat crashed")
            return super().interleave(a, b, pairs, on_pair)

    r = run_agent(FailingRepeat(_speed, noise=0.01, disturbed=1, factor=1.67), tmp_path, only=("compile",))
    assert len(r.noise.readings) == 1 and r.noise.margin > 1.6
    kept = next(s for s in r.steps if s.accepted)  # the one wide A/A: a real 1.3x needs more than two looks
    assert r.final_config["compile.mode"] != "none" and int(kept.reason.split(" look")[0].rsplit(" ", 1)[1]) > 2
    assert "A second A/A failed, so the first alone sets the margin" in noise_text(r)


# A compute-bound step. Its optimizer share (8%) leaves the fused optimizer's prior gain just
# under one thread's (both rounds take three trials), so the rounds go threads first.
COMPUTE_ONLY = {"forward": 0.46, "backward": 0.46, "optimizer": 0.08}


def test_a_recipe_whose_most_promising_config_is_clearly_slower_stops_there(tmp_path):
    """compile's first mode (default) is 30% slower here, in its search reading and in one
    look side by side, so max-autotune (the same compiler, longer) is not measured; the
    incumbent is not measured again either."""

    def speed(c):
        return 100.0 * {"none": 1.0, "default": 0.7, "max-autotune-no-cudagraphs": 0.75}[c.compile.mode]

    runner = FakeRunner(speed, noise=0.01, stages=lambda c: COMPUTE_ONLY)
    r = run_agent(runner, tmp_path, only=("compile",))
    step = r.steps[0]
    assert [t.changes for t in step.trials] == [{"compile.mode": ["none", "default"]}]
    assert not step.accepted and "the rest of its space was not searched" in step.reason, step.reason
    assert "0.7" in step.reason.split("of it side by side")[0][-20:], step.reason  # one look confirmed the reading
    assert len(runner.interleaved) == 3  # two A/As and that one look: no more
    assert r.budget.trials_used == 1
    assert all(c["compile.mode"] != "max-autotune-no-cudagraphs" for c in runner.measured)


class _DisturbedProbe(FakeRunner):
    """The first search reading of a compiled config (or of what `changed` says) is taken
    during a neighbour's burst (every window of a short trial at 0.6x); side by side it
    reads as fast as it is."""

    def __init__(self, *args, changed=lambda c: c.compile.mode != "none", **kw):
        super().__init__(*args, **kw)
        self.burst, self.changed = True, changed

    def measure(self, config, trace=None, on_window=None, floor=None, until=None):
        out = super().measure(config, trace, on_window, floor, until)
        if self.burst and self.changed(config):
            self.burst = False
            windows = [w * 0.6 for w in out.windows_samples_per_s]
            out = out.model_copy(update={"samples_per_s": out.samples_per_s * 0.6, "windows_samples_per_s": windows})
        return out


def test_a_most_promising_config_whose_one_reading_was_disturbed_is_looked_at_side_by_side_and_kept(tmp_path):
    """compile is 1.25x here, but its first search reading falls in a burst (0.6x of the
    incumbent, below the noise band): one side-by-side look shows it is not slower, so the
    search goes on (max-autotune is measured) and that look is not taken again (nor counted as
    evidence for it: it chose it); compile is kept."""

    def speed(c):
        return 100.0 * {"none": 1.0, "default": 1.25, "max-autotune-no-cudagraphs": 1.2}[c.compile.mode]

    runner = _DisturbedProbe(speed, noise=0.01, stages=lambda c: COMPUTE_ONLY)
    r = run_agent(runner, tmp_path, only=("compile",))
    step = r.steps[0]
    assert [t.changes["compile.mode"][1] for t in step.trials] == ["default", "max-autotune-no-cudagraphs"]
    assert step.trials[0].samples_per_s < 80  # the disturbed reading (1.25 x 0.6), stored as measured
    assert step.accepted and r.final_config["compile.mode"] == "default", step.reason
    looks = [p for p in runner.interleaved if {p[0]["compile.mode"], p[1]["compile.mode"]} == {"none", "default"}]
    fresh = int(step.reason.split(" look")[0].rsplit(" ", 1)[1])
    # the look, the fresh looks and the final comparison with the baseline: no second first look
    assert len(looks) == 1 + fresh + 1, step.reason


def test_a_fallback_recipes_one_candidate_is_not_dropped_on_one_disturbed_reading(tmp_path):
    """fused is 1.1x here, but its one search reading falls in a burst (0.6x, below the
    noise band). It is the optimizer round's only candidate (foreach is measured only when
    fused cannot run), so one look side by side decides whether the round ends: it reads
    fused faster, and fused is kept (transformer_encoder's fused AdamW read 0.87x once and
    its round ended; side by side it reads 1.07x)."""

    def speed(c):
        return 100.0 * {"default": 1.0, "fused": 1.1, "foreach": 1.0}[c.optimizer.impl]

    runner = _DisturbedProbe(speed, noise=0.01, stages=lambda c: COMPUTE_ONLY,
                             changed=lambda c: c.optimizer.impl != "default")
    r = run_agent(runner, tmp_path, only=("optimizer-impl",))
    step = r.steps[0]
    assert [t.config["optimizer.impl"] for t in step.trials] == ["fused"]
    assert step.trials[0].samples_per_s < 80  # the disturbed reading, stored as measured
    assert step.accepted and r.final_config["optimizer.impl"] == "fused", step.reason
    fresh = int(step.reason.split(" look")[0].rsplit(" ", 1)[1])
    looks = [p for p in runner.interleaved if {p[0]["optimizer.impl"], p[1]["optimizer.impl"]} == {"default", "fused"}]
    assert len(looks) == 1 + fresh + 1, step.reason  # the recheck's look is not taken again


def test_a_fallback_recipes_one_candidate_slower_side_by_side_too_ends_its_round(tmp_path):
    """The same look confirms a reading that was right: fused at 0.7x reads 0.7x side by
    side, and the round ends without another comparison (nor foreach)."""

    def speed(c):
        return 100.0 * {"default": 1.0, "fused": 0.7, "foreach": 1.0}[c.optimizer.impl]

    runner = FakeRunner(speed, noise=0.01, stages=lambda c: COMPUTE_ONLY)
    r = run_agent(runner, tmp_path, only=("optimizer-impl",))
    step = r.steps[0]
    assert [t.config["optimizer.impl"] for t in step.trials] == ["fused"]
    assert not step.accepted and r.final_config.get("optimizer.impl", "default") == "default"
    assert "0.7" in step.reason.split("of it side by side")[0][-20:], step.reason
    assert len(runner.interleaved) == 3  # two A/As and that one look


def test_every_round_says_how_it_ended_even_without_a_comparison(tmp_path):
    """A round that ends before any candidate is compared (its one candidate read slower
    side by side, or no trial came within the band) still announces its end with the
    step's reason: the terminal showed nothing for such a round, as if it had not run."""
    from autotune.events import Silent

    class Heard(Silent):
        def __init__(self) -> None:
            self.said: list[tuple[str, bool, str]] = []

        def decision(self, recipe: str, accepted: bool, reason: str) -> None:
            self.said.append((recipe, accepted, reason))

    def speed(c):
        return 100.0 * {"default": 1.0, "fused": 0.7, "foreach": 1.0}[c.optimizer.impl]

    heard = Heard()
    runner = FakeRunner(speed, noise=0.01, stages=lambda c: COMPUTE_ONLY)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    r = Agent(runner, load_recipes(), storage, "s", Settings(only=("optimizer-impl",)), FACTS, events=heard).run()
    assert len(runner.interleaved) == 3 and r.steps[0].after_config is None  # its one look; nothing was offered
    assert heard.said == [("optimizer-impl", False, r.steps[0].reason)]


def test_a_fallback_is_measured_only_when_the_first_choice_cannot_run(tmp_path):
    """foreach is the optimizer recipe's fallback: not measured when fused runs (and helps),
    measured and kept when fused cannot run with this optimizer."""
    from autotune.errors import TrialFailed

    def speed(c):
        return 100.0 * {"default": 1.0, "fused": 1.3, "foreach": 1.2}[c.optimizer.impl]

    runner = FakeRunner(speed, noise=0.01, stages=lambda c: COMPUTE_ONLY)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    r = run_agent(runner, tmp_path / "a", only=("optimizer-impl",))
    assert [t.config["optimizer.impl"] for t in r.steps[0].trials] == ["fused"]
    assert r.final_config["optimizer.impl"] == "fused"

    def no_fused(c):
        if c.optimizer.impl == "fused":
            raise TrialFailed("user_code", "`fused=True` is not supported by this optimizer")
        return speed(c)

    r = run_agent(FakeRunner(no_fused, noise=0.01, stages=lambda c: COMPUTE_ONLY), tmp_path / "b",
                  only=("optimizer-impl",))
    assert [t.config["optimizer.impl"] for t in r.steps[0].trials] == ["fused", "foreach"]
    assert r.steps[0].accepted and r.final_config["optimizer.impl"] == "foreach"


def test_the_loader_climbs_a_workers_ladder_then_tunes_the_rest_from_its_best(tmp_path):
    """CPU-bound decoding on a small machine: throughput peaks at 3 workers and falls after.
    The ladder 1, 2, 4 stops at the first rung clearly past the peak (8 is never started),
    3 is tried between the best rung's neighbours, then prefetch and persistent workers are
    searched from 3 workers; far fewer trials than the space's 24 configs."""

    def speed(c):
        w = c.data.num_workers
        base = {0: 100, 1: 150, 2: 190, 3: 220, 4: 160, 6: 120, 8: 100}[w]
        return base * (1.1 if c.data.prefetch_factor == 4 else 1.0) * (1.05 if c.data.persistent_workers else 1.0)

    def stages(c):
        data = 0.5 if c.data.num_workers < 3 else 0.2
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) * 0.4, "optimizer": (1 - data) * 0.1}

    runner = FakeRunner(speed, noise=0.01, stages=stages)
    r = run_agent(runner, tmp_path, only=("dataloader",))
    step = r.steps[0]
    workers = [t.config["data.num_workers"] for t in step.trials]
    assert workers[:3] == [1, 2, 4] and 8 not in workers and 6 not in workers, workers
    assert workers[3] == 3
    rest = step.trials[4:]
    assert rest and all(t.config["data.num_workers"] == 3 for t in rest)
    # 3 rungs, 1 between, 2 knobs alone, 1 together, then (trials spare) the default threads
    # alone and with the two; of 28 configs
    assert len(step.trials) <= 9
    assert step.trials[0].changes["backend.num_threads"] == [None, 1]  # shown against the round's config
    assert step.accepted
    assert r.final_config["data.num_workers"] == 3 and r.final_config["data.prefetch_factor"] == 4
    assert r.final_config["data.persistent_workers"] is True


def test_fewer_threads_are_tried_on_a_compute_bound_step_and_kept_when_they_help(tmp_path, monkeypatch):
    """Many small ops: splitting each across the cores costs more than it gives. The threads
    recipe tries half the cores first; it is a compute recipe, so no data wait is needed."""
    monkeypatch.setattr(machine, "cores", lambda: 8)

    def speed(c):
        return 100.0 * {None: 1.0, 4: 1.25, 2: 1.4, 1: 1.3}[c.backend.num_threads]

    r = run_agent(FakeRunner(speed, noise=0.01, stages=lambda c: COMPUTE_ONLY), tmp_path, only=("threads",))
    step = r.steps[0]
    assert [t.config["backend.num_threads"] for t in step.trials] == [4, 2, 1]
    assert step.accepted and r.final_config["backend.num_threads"] == 2


def test_a_ladder_from_the_middle_of_its_range_goes_down_when_up_does_not_help():
    from autotune.ladder import ladder as _ladder

    assert _ladder([1, 2, 3, 4, 6, 8], 0) == [1, 2, 4, 8]
    assert _ladder([1, 2, 3, 4, 6, 8, 12, 16], None) == [1, 2, 4, 8, 16]
    assert _ladder([50, 100, 200], 25.0) == [50, 100, 200]
    assert _ladder([1, 2, 5, 10], 25.0, down=True) == [10, 5, 2, 1]
    assert _ladder([3, 5, 7], 0) == [3, 7]  # the range's end is always a rung


def test_ddp_buckets_are_searched_down_from_the_default_when_larger_ones_are_slower(tmp_path):
    """Small buckets overlap the all-reduce with backward here: up from DDP's 25 MB is worse,
    so the ladder turns and goes down."""

    def speed(c):
        return 100.0 * {1: 1.1, 2: 1.2, 5: 1.35, 10: 1.2, 25: 1.0, 50: 0.8, 100: 0.7, 200: 0.6}[
            int(c.distributed.bucket_cap_mb)]

    stages = {"forward": 0.3, "backward": 0.3, "communication": 0.4}
    runner = FakeRunner(speed, noise=0.01, stages=lambda c: stages)
    runner.workload = with_world_size(runner.workload, 2)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    r = Agent(runner, load_recipes(), storage, "s", Settings(only=("ddp",)), {**FACTS, "distributed": True}).run()
    step = r.steps[0]
    buckets = [t.config["distributed.bucket_cap_mb"] for t in step.trials]
    assert buckets[:2] == [50, 100] and 200 not in buckets, buckets  # up: slower twice, stop
    assert buckets[2:5] == [10, 5, 2], buckets  # down: 10, 5, then 2 is past the peak
    assert r.final_config["distributed.bucket_cap_mb"] == 5


def test_a_first_rung_that_dips_does_not_end_the_ladder(tmp_path):
    """CPU-bound decoding: one worker is slower than decoding in the step (the step waits on
    one process), two and three are faster. A ladder that stopped at its first rung kept the
    default (seen in the benchmark: decode_bound ended at 0.67 of the grid's best)."""

    def speed(c):
        return {0: 100, 1: 70, 2: 150, 3: 170, 4: 110, 6: 100, 8: 90}[c.data.num_workers]

    def stages(c):
        data = 0.6 if c.data.num_workers < 3 else 0.3
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) * 0.4, "optimizer": (1 - data) * 0.1}

    r = run_agent(FakeRunner(speed, noise=0.01, stages=stages), tmp_path, only=("dataloader",))
    step = r.steps[0]
    assert [t.config["data.num_workers"] for t in step.trials][:4] == [1, 2, 4, 3]
    assert step.accepted and r.final_config["data.num_workers"] == 3


def test_a_range_whose_top_reads_within_noise_of_the_best_still_grows(tmp_path):
    """Remote-store latency: 8 workers read a little below 6 once (within the noise), the
    step still waits for data most of the time; the range grows past 8 instead of stopping
    at 6 (seen in the benchmark: input_bound kept 6 workers with 72% of the step waiting)."""

    def speed(c):
        w = c.data.num_workers
        return 690.0 if w == 8 else 100.0 * (1 + w)  # 8 reads just below 6 (700)

    def stages(c):
        data = 0.8 if c.data.num_workers < 30 else 0.05
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) * 0.4, "optimizer": (1 - data) * 0.1}

    r = run_agent(FakeRunner(speed, noise=0.0, stages=stages), tmp_path, only=("dataloader",))
    step = r.steps[0]
    assert step.grown and "grown to" in step.grown[0], step.grown
    assert "read within the noise of the best" in step.grown[0]
    assert r.final_config["data.num_workers"] > 8


def test_a_recipe_with_nothing_left_to_try_is_not_revisited(tmp_path, monkeypatch):
    """On 2 cores the threads recipe has one value (1 thread). Once it is kept, the data wait
    it targets grows (the step got faster), which would call for a revisit: but no value is
    left to try, so no empty round is played; both changes are kept."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        return 100.0 * (1.5 if c.backend.num_threads == 1 else 1.0) * (1.5 if c.optimizer.impl == "fused" else 1.0)

    def stages(c):  # each kept change leaves the data wait a larger share of a shorter step
        data = 0.1 * (2 if c.backend.num_threads == 1 else 1) * (2 if c.optimizer.impl == "fused" else 1)
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) * 0.4, "optimizer": (1 - data) * 0.1}

    r = run_agent(FakeRunner(speed, noise=0.01, stages=stages), tmp_path, only=("threads", "optimizer-impl"))
    rounds = [s.recipe for s in r.steps if not s.recipe.startswith("undo-")]
    assert sorted(rounds) == ["optimizer-impl", "threads"], rounds  # each once: no empty revisit
    assert all(s.trials for s in r.steps), [(s.recipe, len(s.trials)) for s in r.steps]
    assert sorted(x.recipe for x in r.recommendations if x.accepted) == ["optimizer-impl", "threads"]


def test_workers_that_only_help_with_fewer_threads_are_found(tmp_path):
    """CPU-bound decoding on 2 cores: workers fight the step's two intra-op threads, so more
    workers alone lose and one thread alone loses; together they gain (decode_bound's grid:
    3 workers + 1 thread is its best). The ladder is climbed with 1 thread first."""

    def speed(c):
        w, one = c.data.num_workers, c.backend.num_threads == 1
        if not one:
            return {0: 100}.get(w, 80.0)
        return {0: 94, 1: 110, 2: 140, 3: 150, 4: 120}.get(w, 90.0)

    def stages(c):
        data = 0.6 if speed(c) < 140 else 0.3
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) * 0.4, "optimizer": (1 - data) * 0.1}

    r = run_agent(FakeRunner(speed, noise=0.01, stages=stages), tmp_path, only=("dataloader",))
    step = r.steps[0]
    assert step.accepted, step.reason
    assert r.final_config["data.num_workers"] == 3 and r.final_config["backend.num_threads"] == 1
    assert len(step.trials) <= 8


def test_a_knob_that_lost_most_of_the_noise_band_alone_is_left_out_of_the_knobs_tried_together(tmp_path,
                                                                                               monkeypatch):
    """On a machine whose band is 1.5, the default threads alone read 0.78x of 3 workers at
    one thread: within the band, but more likely a loss than a hidden gain. Prefetch 4 and
    persistent workers, which helped alone, are tried together without it (decode_bound's
    three together read 0.83x; its grid's best is the two without the default threads)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.setattr(Context, "band", property(lambda self: 1.5))

    def speed(c):
        w, one = c.data.num_workers, c.backend.num_threads == 1
        base = {0: 100.0, 1: 130.0, 2: 170.0, 3: 200.0, 4: 150.0}.get(w, 120.0) * (1.0 if one or not w else 0.78)
        prefetch = 1.15 if w and c.data.prefetch_factor == 4 else 1.0
        return base * prefetch * (1.1 if w and c.data.persistent_workers else 1.0)

    def stages(c):
        data = 0.6 if speed(c) < 150 else 0.2
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) * 0.4, "optimizer": (1 - data) * 0.1}

    r = run_agent(FakeRunner(speed, noise=0.01, stages=stages), tmp_path, only=("dataloader",))
    tried = [t.config for t in r.steps[0].trials]
    both = [c for c in tried if c["data.num_workers"] == 3 and c["data.prefetch_factor"] == 4
            and c["data.persistent_workers"]]
    assert any(c["backend.num_threads"] is None for c in tried if c["data.num_workers"] == 3)  # tried alone
    assert both and all(c["backend.num_threads"] == 1 for c in both), [t.changes for t in r.steps[0].trials]


def _loader_stages(speed):
    """Stage shares of a loader-bound step: the data wait large while the step is slow."""
    def stages(c):
        data = 0.6 if speed(c) < 150 else 0.2
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) * 0.4, "optimizer": (1 - data) * 0.1}
    return stages


def test_a_lucky_rung_is_compared_side_by_side_with_the_rungs_within_noise_before_the_rest_is_tried_from_it(
        tmp_path, monkeypatch):
    """The ladder's best rung is the highest of several single readings. Here 2 workers'
    one search reading is lucky (1.3x its speed), above 3 workers, the true peak, within the
    noise band: the two are compared side by side, 3 workers win, and prefetch 4 and
    persistent workers are tried from 3 (decode_bound's ladder read 2 workers 2332 and 3
    workers 1964; its grid's best, 3 workers with both, was never measured)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.setattr(Context, "band", property(lambda self: 1.4))
    runner = None

    def speed(c):
        w = c.data.num_workers
        base = {0: 100.0, 1: 130.0, 2: 180.0, 3: 200.0, 4: 150.0}.get(w, 120.0)
        searched = sum(m.get("data.num_workers") == 2 for m in runner.measured)
        compared = any(2 in (a.get("data.num_workers"), b.get("data.num_workers")) for a, b in runner.interleaved)
        lucky = 1.3 if w == 2 and searched == 1 and not compared else 1.0  # its search trial's windows
        prefetch = 1.1 if w and c.data.prefetch_factor == 4 else 1.0
        return base * lucky * prefetch * (1.1 if w and c.data.persistent_workers else 1.0)

    runner = FakeRunner(speed, noise=0.01, stages=_loader_stages(speed))
    r = run_agent(runner, tmp_path, only=("dataloader",))
    step = r.steps[0]
    assert [t.config["data.num_workers"] for t in step.trials][:4] == [1, 2, 4, 3]
    assert step.trials[1].samples_per_s > step.trials[3].samples_per_s  # the lucky reading led the ladder
    # The rest from 3, but for one spare trial after the together config: the runner-up rung
    # with the kept knobs.
    elsewhere = [t.config for t in step.trials[4:] if t.config["data.num_workers"] != 3]
    assert len(elsewhere) <= 1 and all(c["data.prefetch_factor"] == 4 and c["data.persistent_workers"]
                                       for c in elsewhere), [t.changes for t in step.trials]
    assert step.accepted, step.reason
    assert r.final_config["data.num_workers"] == 3 and r.final_config["data.persistent_workers"], step.reason
    assert r.final_config["data.prefetch_factor"] == 4
    assert "the other knobs were tried from data.num_workers=3" in step.reason, step.reason


def test_rungs_that_all_read_slower_than_the_incumbent_are_not_dueled(tmp_path, monkeypatch):
    """Every rung reads a little below loading in the step, within the noise band of it and
    of each other: which rung the other knobs start from, and which candidate is offered,
    are not worth a duel's looks (a keyword spotter's loader round spent its 8-minute budget
    on about 24 looks of them). The round ends on the offers' own comparisons."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.setattr(Context, "band", property(lambda self: 1.4))

    def speed(c):
        w = c.data.num_workers
        return 100.0 if not w else {1: 90.0, 2: 96.0, 3: 95.0, 4: 94.0}.get(w, 85.0)

    runner = FakeRunner(speed, noise=0.01, stages=_loader_stages(speed))
    r = run_agent(runner, tmp_path, only=("dataloader",))
    step = r.steps[0]
    assert len(step.trials) >= 3 and not step.accepted, step.reason
    assert all(not (a.get("data.num_workers") and b.get("data.num_workers")) for a, b in runner.interleaved), \
        runner.interleaved  # every side-by-side comparison has the incumbent on one side
    assert "duel" not in step.reason and "other knobs were tried from" not in step.reason, step.reason


def test_the_runner_up_rung_is_tried_with_the_knob_kept_when_no_together_config_took_the_trial(
        tmp_path, monkeypatch):
    """2 workers beat 3 side by side by 2% (within the margin: the rungs cannot be told apart
    on their own) and the other knobs are tried from 2, where persistent workers change
    nothing and prefetch 4 loses; at 3 workers persistent workers gain 30%. The trial no
    together config took goes to the best found at the runner-up rung, and 3 persistent
    workers are kept (decode_bound's ladder went on from 2 after 3 read 0.97x of it over 6
    looks, and ended at 0.91 of its grid's best, 3 persistent workers, with trials unused)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.setattr(Context, "band", property(lambda self: 1.4))

    def speed(c):
        w = c.data.num_workers
        base = {0: 100.0, 1: 130.0, 2: 200.0, 3: 196.0, 4: 140.0}.get(w, 120.0)
        prefetch = 0.7 if w == 2 and c.data.prefetch_factor == 4 else 1.0
        persist = 1.3 if w == 3 and c.data.persistent_workers else 1.0
        return base * prefetch * persist * (0.75 if w and c.backend.num_threads is None else 1.0)

    r = run_agent(FakeRunner(speed, noise=0.01, stages=_loader_stages(speed)), tmp_path, only=("dataloader",))
    step = r.steps[0]
    assert [t.config["data.num_workers"] for t in step.trials][:4] == [1, 2, 4, 3]
    assert any(t.config["data.num_workers"] == 3 and t.config["data.persistent_workers"] for t in step.trials[4:])
    assert step.accepted, step.reason
    assert r.final_config["data.num_workers"] == 3 and r.final_config["data.persistent_workers"], step.reason
    assert len(step.trials) <= 8, [t.changes for t in step.trials]


def _two_rungs(three: float, prefetch: float, persist: float, four: float = 140.0):
    """decode_bound's shape: 2 workers (204) a little ahead of 3 (`three`) alone, prefetch 4
    and persistent workers gaining more at 3 (`prefetch`, `persist`) than at 2 (1.05x, 1.08x),
    the default threads 0.7x, 4 workers `four`; the step waits for data 80-90% of the time throughout."""
    def speed(c):
        w = c.data.num_workers
        base = {0: 100.0, 1: 130.0, 2: 204.0, 3: three, 4: four}.get(w, 120.0)
        pf = {2: 1.05, 3: prefetch}.get(w, 1.0) if c.data.prefetch_factor == 4 else 1.0
        keep = {2: 1.08, 3: persist}.get(w, 1.0) if c.data.persistent_workers else 1.0
        return base * pf * keep * (0.7 if w and c.backend.num_threads is None else 1.0)

    def stages(c):
        data = 0.9 if speed(c) < 150 else 0.8
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) * 0.4, "optimizer": (1 - data) * 0.1}
    return speed, stages


def _two_rungs_run(tmp_path, monkeypatch, band: float, noise: float, cpu_bound: bool = False, **shape):
    """The dataloader round alone on `_two_rungs(**shape)`, 2 cores, the noise band patched
    to `band` (`cpu_bound`: the loading thread's CPU share says decoding: not grown past 4);
    returns the run and the step whose final config it checks (3 workers with both knobs)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.setattr(Context, "band", property(lambda self: band))
    speed, stages = _two_rungs(**shape)
    cpu = {"signals": lambda c: {} if c.data.num_workers else {"data_cpu_share": 1.0}} if cpu_bound else {}
    r = run_agent(FakeRunner(speed, noise=noise, stages=stages, **cpu), tmp_path, only=("dataloader",), trials=8)
    step = r.steps[0]
    assert step.accepted, step.reason
    final = r.final_config
    assert final["data.num_workers"] == 3 and final["data.persistent_workers"] and final["data.prefetch_factor"] == 4, \
        [(t.changes, t.samples_per_s) for t in step.trials]
    return r, step


def test_the_runner_up_rung_with_the_knobs_kept_together_comes_before_the_other_thread_count(
        tmp_path, monkeypatch):
    """2 workers beat 3 side by side by 2% (within the margin) and both other knobs help at 2,
    so they are tried together there; at 3 workers they help more (its grid's best, 3 workers
    with both). The next trial goes to 3 workers with both, and none to the default threads
    alone at 2 workers: the climb at one thread held its own, and the step there still waits
    for data most of the time, so one thread still comes first (decode_bound's step at 3
    workers waits 86%; its default threads read 0.46-0.88x of one thread in nine runs, and
    its runs that went on from 2 workers ended at 0.91-0.92 of the grid's best)."""
    _, step = _two_rungs_run(tmp_path, monkeypatch, 1.4, 0.01, three=200.0, prefetch=1.15, persist=1.2)
    assert [t.config["data.num_workers"] for t in step.trials][:4] == [1, 2, 4, 3]
    assert "the other knobs were tried from data.num_workers=2" in step.reason, step.reason
    assert len(step.trials) == 8 and all(t.config["backend.num_threads"] == 1 for t in step.trials), \
        [t.changes for t in step.trials]


def test_a_spare_trial_goes_to_the_runner_up_rung_with_the_kept_knobs_even_past_the_margin(tmp_path, monkeypatch):
    """As above, but 3 workers read 0.93x of 2 side by side (past the 3% margin, inside the
    noise band), less of a loss than the two knobs gain together at 2 (1.13x): after the
    together config a trial of the round's is still spare, and it goes to 3 workers with both
    knobs, the best config (decode_bound's s25: 3 workers read 0.95x of 2 in one look, the
    round ended with 7 of its 8 trials, at 0.90 of the grid's best, 3 workers with both)."""
    _, step = _two_rungs_run(tmp_path, monkeypatch, 1.4, 0.01, three=190.0, prefetch=1.2, persist=1.25)
    assert "the other knobs were tried from data.num_workers=2" in step.reason, step.reason


def test_with_no_rung_compared_the_spare_trial_goes_to_the_neighbour_rung_its_kept_knobs_could_lift(
        tmp_path, monkeypatch):
    """As above, on a quiet machine (a band of 1.03): 3 workers' one reading, 0.96x of 2,
    is past the band, so no rung is compared side by side, yet it lost less than half what
    the two knobs gain together at 2 (1.13x). The spare trial goes to the neighbouring rung
    with both knobs, the best config (decode_bound's s26: the rungs 3 and 4 read 0.94x of
    2 alone, none was compared, the knobs gained 1.17x together at 2, and the round ended
    with 7 of its 8 trials at 0.89 of the grid's best, 3 workers with both)."""
    _, step = _two_rungs_run(tmp_path, monkeypatch, 1.03, 0.005, three=196.0, prefetch=1.2, persist=1.25)
    assert "the other knobs were tried from" not in step.reason, step.reason


def test_of_two_rungs_compared_the_spare_trial_goes_to_the_neighbour_not_the_one_that_read_a_hair_better(
        tmp_path, monkeypatch):
    """2 workers beat 3 and 4 side by side, 3 by 3% and 4 by 1%: both within the margin,
    a coin's toss apart (the loading is CPU work: the range is not grown past 4). The spare
    trial after the together config goes to the neighbouring rung with the kept knobs (3
    workers, where they gain most: the best config), not to the farther rung whose
    comparison read a hair nearer (decode_bound's s27: 3 workers read 0.97x of 2 and 4
    workers 0.99x, the trial went to 4 workers with both, and the run ended at 0.90 of its
    grid's best, 3 workers with both)."""
    _, step = _two_rungs_run(tmp_path, monkeypatch, 1.4, 0.005, cpu_bound=True,
                             three=198.0, prefetch=1.2, persist=1.25, four=202.0)
    assert [t.config["data.num_workers"] for t in step.trials][:4] == [1, 2, 4, 3]
    assert "data.num_workers=4 read within the noise" in step.reason, step.reason


def test_the_other_thread_count_is_still_tried_with_trials_spare_and_kept_where_it_helps(tmp_path, monkeypatch):
    """The climb at one thread holds its own (loading dominates the step), and at its best
    rung the step's compute is what is left (80% of the step: on 2 cores, one thread no
    longer comes first): the default threads gain 25% there, on top of persistent workers.
    They are tried after the other knobs, and then with the knob kept."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.setattr(Context, "band", property(lambda self: 1.4))

    def speed(c):
        w = c.data.num_workers
        base = {0: 100.0, 1: 130.0, 2: 170.0, 3: 200.0, 4: 150.0}.get(w, 120.0)
        persist = 1.1 if w and c.data.persistent_workers else 1.0
        return base * persist * (1.25 if w == 3 and c.backend.num_threads is None else 1.0)

    r = run_agent(FakeRunner(speed, noise=0.01, stages=_loader_stages(speed)), tmp_path, only=("dataloader",))
    step = r.steps[0]
    assert step.trials[0].config["backend.num_threads"] == 1
    threads = [i for i, t in enumerate(step.trials) if t.config["backend.num_threads"] is None]
    persist = [i for i, t in enumerate(step.trials) if t.config["data.persistent_workers"]]
    assert threads and persist and min(threads) > min(persist), [t.changes for t in step.trials]
    assert step.accepted, step.reason
    final = r.final_config
    assert final["data.num_workers"] == 3 and final["backend.num_threads"] is None, step.reason
    assert final["data.persistent_workers"], [(t.changes, t.samples_per_s) for t in step.trials]


def test_a_change_whose_one_reading_was_unlucky_is_tried_with_the_knob_kept(tmp_path, monkeypatch):
    """3 workers are the clear peak; from it prefetch 4 gains 10% and persistent workers 15%,
    but persistent workers' one search reading falls in a burst (0.7x): only prefetch 4 is
    kept, and the trial no together config took goes to prefetch 4 with persistent workers,
    the left-out change that read highest (decode_bound's persistent workers read 0.71x alone
    once, and its run ended without them at 0.95 of its grid's best)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    monkeypatch.setattr(Context, "band", property(lambda self: 1.4))
    runner = None

    def speed(c):
        w = c.data.num_workers
        base = {0: 100.0, 1: 120.0, 2: 130.0, 3: 200.0, 4: 130.0}.get(w, 110.0)
        persist = w and c.data.persistent_workers
        alone = persist and c.data.prefetch_factor == 2
        searched = sum(bool(m.get("data.persistent_workers")) and m.get("data.prefetch_factor") == 2
                       for m in runner.measured)
        compared = any(a.get("data.persistent_workers") or b.get("data.persistent_workers")
                       for a, b in runner.interleaved)
        burst = 0.7 if alone and searched == 1 and not compared else 1.0
        return (base * (1.1 if w and c.data.prefetch_factor == 4 else 1.0) * (1.15 if persist else 1.0) * burst
                * (0.75 if w and c.backend.num_threads is None else 1.0))

    runner = FakeRunner(speed, noise=0.01, stages=_loader_stages(speed))
    r = run_agent(runner, tmp_path, only=("dataloader",))
    step = r.steps[0]
    assert step.accepted, step.reason
    assert r.final_config["data.num_workers"] == 3 and r.final_config["data.prefetch_factor"] == 4
    assert r.final_config["data.persistent_workers"], [(t.changes, t.samples_per_s) for t in step.trials]


def test_a_climb_that_holds_its_own_is_not_climbed_again_at_the_other_thread_count(tmp_path, monkeypatch):
    """Workers read level with the incumbent at one thread (within the noise: the side-by-side
    comparison decides) and lose at the default: the default's ladder is not climbed; the
    default is tried once, from the best rung, and persistent workers, which help, are found
    (decode_bound spent three of its nine trials on the second climb)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        w, one = c.data.num_workers, c.backend.num_threads == 1
        level = {0: 100.0}.get(w, 99.0 if one else 75.0)
        return level * (1.3 if w and c.data.persistent_workers else 1.0)

    def stages(c):
        data = 0.6 if speed(c) < 110 else 0.1
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) * 0.4, "optimizer": (1 - data) * 0.1}

    r = run_agent(FakeRunner(speed, noise=0.01, stages=stages), tmp_path, only=("dataloader",))
    step = r.steps[0]
    at_default = {t.config["data.num_workers"] for t in step.trials if t.config["backend.num_threads"] is None}
    assert step.trials[0].config["backend.num_threads"] == 1
    assert len(at_default) <= 1, [t.changes for t in step.trials]
    assert step.accepted and r.final_config["data.persistent_workers"], step.reason


def test_a_gain_inside_the_noise_is_measured_again_once_another_change_is_kept(tmp_path, monkeypatch):
    """One thread gains 2% on the default step (inside the 3% margin: rejected), 30% once the
    fused optimizer has removed the larger cost (seen: overhead_bound's grid's best is
    compile + fused + 1 thread, and autotune had rejected 1 thread first, at 1.04x)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        fused = c.optimizer.impl == "fused"
        one = c.backend.num_threads == 1
        return 100.0 * (1.8 if fused else 1.0) * ((1.3 if fused else 1.02) if one else 1.0)

    r = run_agent(FakeRunner(speed, noise=0.002, stages=lambda c: COMPUTE_ONLY), tmp_path,
                  only=("threads", "optimizer-impl"))
    assert [(s.recipe, s.accepted) for s in r.steps] == [("threads", False), ("optimizer-impl", True),
                                                          ("threads", True), ("undo-optimizer-impl", False)], \
        [(s.recipe, s.reason) for s in r.steps]
    assert r.final_config["backend.num_threads"] == 1 and r.final_config["optimizer.impl"] == "fused"


def test_a_near_miss_of_a_large_space_is_revisited_as_itself_not_searched_again(tmp_path, monkeypatch):
    """The loader's round finds no worker count that helps; its best, 1 thread, reads 2%
    faster (inside the margin: rejected). Once the fused optimizer is kept, 1 thread gains
    30%: the loader's revisit measures its near-miss from the new config, one trial, and
    keeps it (resnet_jpeg's loader revisits climbed 5 trials again to end at the same
    1 thread, and took its run past a quarter of its grid's trials)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        fused = c.optimizer.impl == "fused"
        one = c.backend.num_threads == 1
        workers = 0.8 if c.data.num_workers else 1.0
        return 100.0 * (1.8 if fused else 1.0) * ((1.3 if fused else 1.02) if one else 1.0) * workers

    stages = {"data": 0.3, "forward": 0.3, "backward": 0.3, "optimizer": 0.1}
    r = run_agent(FakeRunner(speed, noise=0.002, stages=lambda c: stages), tmp_path,
                  only=("dataloader", "optimizer-impl"))
    loader = [s for s in r.steps if s.recipe == "dataloader"]
    assert [(s.recipe, s.accepted) for s in r.steps][:3] == [("dataloader", False), ("optimizer-impl", True),
                                                             ("dataloader", True)], \
        [(s.recipe, s.reason) for s in r.steps]
    assert loader[0].changes == {"backend.num_threads": [None, 1]}, loader[0].reason
    assert len(loader[1].trials) == 1 and "its near-miss (backend.num_threads=1)" in loader[1].reason
    assert r.final_config["backend.num_threads"] == 1 and r.final_config["optimizer.impl"] == "fused"


def test_a_clear_loss_is_not_measured_again(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        return 100.0 * (1.8 if c.optimizer.impl == "fused" else 1.0) * (0.7 if c.backend.num_threads == 1 else 1.0)

    r = run_agent(FakeRunner(speed, noise=0.002, stages=lambda c: COMPUTE_ONLY), tmp_path,
                  only=("threads", "optimizer-impl"))
    assert [s.recipe for s in r.steps] == ["threads", "optimizer-impl"]


def _stages_summary(stages: dict[str, float]) -> Summary:
    return Summary(config={}, step_time_s=StepTime(median=0.01, p90=0.011, mean=0.01), samples_per_s=100.0,
                   windows_samples_per_s=[100.0] * 3, window_cv=0.0,
                   stages={k: StageTime(s=0.01 * v, share=v) for k, v in stages.items()},
                   window_stage_shares=[stages] * 3, signals=Signals(ops_per_step=10, mean_op_us=500.0))


def test_a_fused_optimizer_ranks_by_the_optimizer_steps_own_share():
    """Amdahl on the stage a recipe acts on: where the optimizer step is most of the step (Adam
    over many small layers) a fused optimizer is the first compute recipe; where it is 6%
    (a wide MLP), it comes after the recipes that act on the whole compute for as many trials."""
    from autotune.plan import Attempts, rank

    def order(stages):
        v = diagnose(_stages_summary(stages), "cpu")
        return [c.recipe.name for c in rank(load_recipes(), v, "cpu", FACTS, Attempts(), margin=1.03)]

    heavy = order({"forward": 0.12, "backward": 0.18, "optimizer": 0.7})
    light = order({"forward": 0.34, "backward": 0.6, "optimizer": 0.06})
    assert heavy[0] == "optimizer-impl", heavy
    assert light.index("optimizer-impl") > max(light.index("threads"), light.index("amp")), light
    assert set(light) == set(heavy), light


def test_on_a_dispatch_bound_step_a_fused_optimizer_removes_the_dispatch_inside_its_stage():
    """A step of a thousand 2-us ops: a fused optimizer removes the optimizer's share of that
    dispatch, not a fixed part of all of it. Where the optimizer is half the model's time
    (overhead_bound: 1.7-1.8x fused) it is tried before fewer threads and compile (which had
    spent three trials and a second compile round before it); where it is 6%, after them."""
    from autotune.plan import Attempts, rank

    def order(stages):
        s = _stages_summary(stages).model_copy(update={
            "signals": Signals(ops_per_step=1024, mean_op_us=2.0),
            "step_time_s": StepTime(median=0.0023, p90=0.0025, mean=0.0023)})  # dispatch: 89% of the step
        v = diagnose(s, "cpu")
        assert v.bottleneck is Bottleneck.LAUNCH and v.waste(Bottleneck.LAUNCH).share > 0.8
        return [c.recipe.name for c in rank(load_recipes(), v, "cpu", FACTS, Attempts(), margin=1.03)]

    heavy = order({"forward": 0.16, "backward": 0.3, "optimizer": 0.52, "data": 0.02})
    light = order({"forward": 0.34, "backward": 0.58, "optimizer": 0.06, "data": 0.02})
    assert heavy.index("optimizer-impl") < min(heavy.index("threads"), heavy.index("compile")), heavy
    assert light.index("optimizer-impl") > max(light.index("threads"), light.index("compile")), light


def test_a_waste_that_could_gain_barely_more_than_the_margin_gets_a_short_look(tmp_path):
    """A 6.2% data wait: removing all of it gains at most 1.066x, the workers' 90% of it
    1.059x, twice the 3% floor at best; the loader gets two trials, not a whole ladder (a
    ladder at two thread counts took 5)."""

    def speed(c):
        return 100.0 * (0.9 if c.data.num_workers else 1.0)

    stages = {"data": 0.062, "forward": 0.4, "backward": 0.4, "optimizer": 0.138}
    r = run_agent(FakeRunner(speed, noise=0.005, stages=lambda c: stages), tmp_path, only=("dataloader",))
    assert r.steps and r.steps[0].recipe == "dataloader"
    assert len(r.steps[0].trials) <= 2, [t.config for t in r.steps[0].trials]


def test_the_report_says_which_band_judged_single_readings(tmp_path):
    """A machine that drifts: paired windows cancel it (a narrow A/A), readings of one config
    taken minutes apart do not; the band the run ended with is the wider, and said so."""
    runner = FakeRunner(_speed, noise=0.005, drift=-0.002, seed=3)
    r = run_agent(runner, tmp_path, only=("compile", "optimizer-impl"))
    aa_width = max(r.noise.margin, r.noise.high / r.noise.low)
    assert r.noise.band_dof >= 3 and aa_width * 1.01 < r.noise.band < 1.5
    assert "spread of this run's unpaired readings" in noise_text(r)


def test_a_band_set_by_a_wide_aa_is_said_to_be_the_aas(tmp_path, capsys):
    """Under load the A/A alone can be wider than the spread's cap: the report must not
    credit the run's readings with it."""
    runner = _DisturbedAA(_speed, noise=0.01, disturbed=3, factor=1.8)
    r = run_agent(runner, tmp_path, only=("compile",))
    assert r.noise.band >= r.noise.margin > 1.5 and r.noise.band_dof == 0
    assert "(the A/A's width)" in noise_text(r)
    # and the user is told, at the top of each report, that the measurements were too noisy for small gains
    warning = noise_warning(r)
    assert warning is not None and fmt_ratio(r.noise.band) in warning and "nothing else running" in warning
    assert "Noisy measurements" in render_markdown(r) and "Noisy measurements" in render_html(r)
    print_tune_summary(r, tmp_path)
    out = " ".join(capsys.readouterr().out.split())
    assert "The measurements were noisy" in out and "--steps" in out, out  # the machine, or the step itself


def _first_loader_trial(tmp_path, monkeypatch, data: float) -> dict:
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        s = 100.0 * (1 + 0.1 * min(c.data.num_workers, 2))
        return s * (0.55 if c.backend.num_threads == 1 else 1.0)

    stages = {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) / 2}
    runner = FakeRunner(speed, noise=0.005, stages=lambda c: stages,
                        signals=lambda c: {} if c.data.num_workers else {"data_cpu_share": 1.0})
    r = run_agent(runner, tmp_path, only=("dataloader",))
    return r.steps[0].trials[0].config


def test_workers_are_climbed_with_the_compute_threads_first_where_compute_dominates(tmp_path, monkeypatch):
    """Decoding at 15% of a step whose convolutions take 85% on 2 cores: one intra-op thread
    would make the compute alone 1.7x today's step, so the ladder keeps the threads first."""
    assert _first_loader_trial(tmp_path, monkeypatch, data=0.15)["backend.num_threads"] is None


def test_workers_are_climbed_with_one_thread_first_where_loading_dominates(tmp_path, monkeypatch):
    assert _first_loader_trial(tmp_path, monkeypatch, data=0.9)["backend.num_threads"] == 1


def _loader_after_one_thread(tmp_path, monkeypatch, wait: float, at_one, at_default: float):
    """One intra-op thread kept first (1.1x on this compute-bound step), then the loader on
    the CPU-bound data wait it leaves (`wait`: the wait shows once compute is on one core);
    workers multiply the speed by `at_one(workers)` at one thread, `at_default` at the
    default threads. The report and the loader's step."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        one, w = c.backend.num_threads == 1, c.data.num_workers
        return 100.0 * (1.1 if one else 1.0) * ((at_one(w) if one else at_default) if w else 1.0)

    def stages(c):
        one, w = c.backend.num_threads == 1, c.data.num_workers
        data = wait if one and not w else 0.0 if one else 0.02
        return {"data": data, "forward": (1 - data) / 2, "backward": (1 - data) / 2}

    runner = FakeRunner(speed, noise=0.005, stages=stages,
                        signals=lambda c: {} if c.data.num_workers else {"data_cpu_share": 1.0})
    r = run_agent(runner, tmp_path, only=("threads", "dataloader"))
    assert r.steps[0].recipe == "threads" and r.steps[0].accepted, r.steps[0].reason
    loader = [s for s in r.steps if s.recipe == "dataloader"]
    assert loader, [(s.recipe, s.reason) for s in r.steps]
    return r, loader[0]


def test_a_loader_look_after_one_thread_was_kept_climbs_at_one_thread(tmp_path, monkeypatch):
    """The data wait left (6%) gets the loader's short look: it climbs at the kept thread,
    where a worker has the free core, not at the default threads that the step's 94%
    compute would otherwise put first, which would revert the measured gain
    (overhead_bound's s28: two trials at 0.45x)."""
    r, loader = _loader_after_one_thread(tmp_path, monkeypatch, 0.06, lambda w: 1.06, 0.5)
    assert loader.trials[0].config["backend.num_threads"] == 1, [t.changes for t in loader.trials]
    assert r.final_config["backend.num_threads"] == 1


def test_a_lever_that_costs_more_than_its_whole_waste_is_not_climbed_at_the_other_threads(tmp_path, monkeypatch):
    """A data wait of 8% (at most 1.09x): workers read 0.6x and 0.7x at the kept thread, so
    even removing the whole wait leaves them behind; the loader is not climbed again at the
    default threads, nor are they tried alone (the threads round's question;
    overhead_bound's s29: three more trials, 10 of its grid's 24), and the report says why."""
    r, loader = _loader_after_one_thread(tmp_path, monkeypatch, 0.08, lambda w: {1: 0.6, 2: 0.7}.get(w, 0.5), 0.45)
    climbed = [t.config for t in loader.trials if t.config["data.num_workers"]]
    assert len(climbed) >= 2, [t.changes for t in loader.trials]
    assert all(t.config["backend.num_threads"] == 1 for t in loader.trials), [t.changes for t in loader.trials]
    assert "was not climbed at backend.num_threads=" in loader.reason, loader.reason
    assert r.final_config["backend.num_threads"] == 1 and not r.final_config["data.num_workers"]


def test_a_first_rung_whose_dip_the_next_could_not_make_up_ends_the_ladder(tmp_path, monkeypatch):
    """A small step waiting 8% on CPU-bound loading: one worker reads 0.41x (the batches'
    trip between processes costs more than the wait). Two workers could read at most twice
    that, 0.82x, still beyond the noise: the ladder stops at its first rung, and with a
    lever that far below what the wait could give (1.09x) no other threads are climbed
    (overhead_bound's s28 and s29: one worker 0.41x, two 0.37x)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        return 100.0 * {0: 1.0, 1: 0.41, 2: 0.8}.get(c.data.num_workers, 0.45)

    stages = {"data": 0.08, "forward": 0.46, "backward": 0.46}
    runner = FakeRunner(speed, noise=0.005, stages=lambda c: stages,
                        signals=lambda c: {} if c.data.num_workers else {"data_cpu_share": 1.0})
    r = run_agent(runner, tmp_path, only=("dataloader",))
    step = r.steps[0]
    assert [t.config["data.num_workers"] for t in step.trials] == [1], [t.changes for t in step.trials]
    assert "was not climbed at backend.num_threads=1" in step.reason, step.reason
    assert not step.accepted


def test_a_lever_whose_loss_its_waste_could_cover_is_climbed_at_the_other_threads(tmp_path, monkeypatch):
    """Decoding at 30% of the step (at most 1.43x): workers read 0.8x at the default threads
    the 70% compute puts first, a loss removing the wait could more than cover, so the
    ladder climbs again at one thread, where a worker has a core of its own and gains."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        one, w = c.backend.num_threads == 1, c.data.num_workers
        return 100.0 * (0.9 if one else 1.0) * ((1.4 if one else 0.8) if w else 1.0)

    stages = {"data": 0.3, "forward": 0.35, "backward": 0.35}
    runner = FakeRunner(speed, noise=0.005, stages=lambda c: stages,
                        signals=lambda c: {} if c.data.num_workers else {"data_cpu_share": 1.0})
    r = run_agent(runner, tmp_path, only=("dataloader",))
    trials = [t.config for t in r.steps[0].trials if t.config["data.num_workers"]]
    assert trials[0]["backend.num_threads"] is None, trials
    assert any(c["backend.num_threads"] == 1 for c in trials), trials
    assert r.final_config["backend.num_threads"] == 1 and r.final_config["data.num_workers"], r.steps[0].reason


def test_the_band_a_single_reading_is_judged_by_is_one_aas_width_not_the_pooled_aas():
    """Two A/As are pooled for the margin, but a search reading has one A/A's worth of
    windows: the band's floor is a single A/A's width, wider than the pooled one's."""
    from autotune.agent import _band
    from autotune.config import TrainConfig
    from autotune.evidence import pooled
    from autotune.record import Comparison
    from autotune.stats import paired_ratio

    a = [100.0, 100.0, 100.0, 100.0, 100.0]
    b1, b2 = [112.0, 90.0, 108.0, 93.0, 99.0], [91.0, 110.0, 94.0, 107.0, 100.0]
    first, second = (Comparison(**paired_ratio(a, b), a=a, b=b) for b in (b1, b2))
    both = pooled(first, second)
    assert both.high / both.low < first.high / first.low
    steady = FakeRunner(lambda c: 100.0, noise=0.0).open(TrainConfig()).summary()
    band = _band(both, 1.03, steady, [first, second])
    assert band >= min(first.high / first.low, second.high / second.low) * 0.999


def test_cpu_bound_loading_whose_range_already_saturates_the_cores_is_not_grown(tmp_path, monkeypatch):
    """Loading 85% CPU work on 2 cores: 2.4 workers keep the cores busy and the range's 4
    exceed that 1.5x; the host's limit (5) would allow one more, which could only share them."""
    r = _loader_run(tmp_path, monkeypatch, cpu_share=0.85)
    step = r.steps[0]
    workers = {t.config["data.num_workers"] for t in step.trials}
    assert max(workers) == 4, workers
    assert any("keep the 2 cores busy" in note and "range not grown" in note for note in step.grown), step.grown


def test_the_ladder_does_not_measure_again_a_config_a_climb_already_measured(tmp_path, monkeypatch):
    """Workers lose at the default threads (the first climb, compute dominating the step) and
    come level at one thread; from that best rung the other knobs are tried alone, and the
    default threads there is the first climb's first rung: read once, not twice (resnet_jpeg
    measured 1 worker at the default threads in both its climb and its rest stage)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        w, one = c.data.num_workers, c.backend.num_threads == 1
        if not w:
            return 100.0
        return {1: 99.0, 2: 97.0}.get(w, 90.0) if one else {1: 90.0}.get(w, 85.0)

    stages = {"data": 0.15, "forward": 0.4, "backward": 0.4, "optimizer": 0.05}
    r = run_agent(FakeRunner(speed, noise=0.005, stages=lambda c: stages), tmp_path, only=("dataloader",))
    tried = [tuple(sorted(t.config.items())) for t in r.steps[0].trials]
    assert r.steps[0].trials[0].config["backend.num_threads"] is None  # the default threads' climb first
    assert any(t.config["backend.num_threads"] == 1 for t in r.steps[0].trials)  # then one thread's
    assert len(tried) == len(set(tried)), [t.changes for t in r.steps[0].trials]


def test_a_grown_range_of_workers_carries_persistent_workers_that_held_their_own(tmp_path, monkeypatch):
    """Waiting on I/O, workers keep helping past the range's 8; restarting them at every epoch
    costs more the more there are (nothing at 8 within the noise, 10% at 16, 30% at 32), and
    persistent ones cost a flat 3%; past 32 workers the store gives no more. The best of the
    range is 8 restarted workers, persistent ones level with it: the range grows with them,
    and 32 or more persistent workers are kept (the
    README's input_bound run grew without them: 16 restarted workers, 7.9x, where 16
    persistent had given 12.1x)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        w = c.data.num_workers
        restart = 1.0 if c.data.persistent_workers else 1 / (1 + 0.0004 * w * w)
        return 100.0 * (1 + min(w, 32)) * (0.97 if c.data.persistent_workers else restart)

    stages = lambda c: {"data": 0.8, "forward": 0.1, "backward": 0.1}  # noqa: E731
    r = run_agent(FakeRunner(speed, noise=0.003, stages=stages), tmp_path, only=("dataloader",))
    step = r.steps[0]
    assert any("grown to 16, 32, with data.persistent_workers=True" in note for note in step.grown), step.grown
    assert r.final_config["data.num_workers"] >= 32 and r.final_config["data.persistent_workers"], r.final_config


def test_a_smaller_micro_batch_than_one_that_fits_is_not_measured(tmp_path):
    """The benchmark's memory case on a Zen 4, once: half the batch alone read as fast as
    the whole batch (over the limit), so every smaller micro-batch was predicted as fast;
    bf16 with half the batch fit at 0.75 of what the product promised, and the search went
    on to bf16 with a quarter and an eighth of the batch (7 trials of the grid's 20). With
    the other knobs the same, a smaller micro-batch than one that fits only runs more
    steps: once bf16 with half the batch fits, its smaller micro-batches are not tried, and
    what a pair of knobs read against the model stays corrected from one of its readings
    to the next."""

    def memory(c):
        mb = c.memory.micro_batch_size or 32
        mem = 190.0 * (0.6 if c.precision.amp == "bf16" else 1.0) * (0.24 + 0.76 * mb / 32)
        return int(mem * (0.52 if c.memory.activation_checkpointing else 1.0))

    def speed(c):
        bf16, mb, ckpt = c.precision.amp == "bf16", c.memory.micro_batch_size, c.memory.activation_checkpointing
        s = 100.0 * (1.5 if bf16 else 1.0) * {None: 1.0, 16: 1.02, 8: 0.8, 4: 0.55, 2: 0.35}[mb]
        return s * (0.7 if ckpt else 1.0) * (0.75 if bf16 and mb else 1.0)

    r, step, tried = _memory_joint(tmp_path, speed, memory)
    assert ("bf16", 16, False) in tried, tried
    assert not [m for a, m, k in tried if a == "bf16" and not k and m is not None and m < 16], tried
    assert len(tried) <= 5, tried
    assert (step.after_config["precision.amp"], step.after_config["memory.micro_batch_size"]) == ("bf16", 16)


def test_a_later_round_takes_an_earlier_rounds_reading_of_the_same_config(tmp_path):
    """The loader's round tries one thread alone from its incumbent (no worker helped); the
    threads round's only config is that one: it takes that reading, measures nothing, and
    the budget counts one trial for it."""

    def speed(c):
        return 100.0 * (1.0 if c.backend.num_threads == 1 else 1.02) * (0.7 if c.data.num_workers else 1.0)

    stages = {"data": 0.3, "forward": 0.3, "backward": 0.3, "optimizer": 0.1}
    runner = FakeRunner(speed, noise=0.01, stages=lambda c: stages)
    r = run_agent(runner, tmp_path, only=("dataloader", "threads"))
    loader, threads = r.steps[0], r.steps[1]
    assert loader.recipe == "dataloader" and threads.recipe == "threads", [s.recipe for s in r.steps]
    alone = [t for t in loader.trials if t.changes == {"backend.num_threads": [None, 1]}]
    assert alone and [t.changes for t in threads.trials] == [{"backend.num_threads": [None, 1]}]
    assert threads.trials[0].reused_from and threads.trials[0].samples_per_s == alone[0].samples_per_s
    one_thread = [c for c in runner.measured if c["backend.num_threads"] == 1 and not c["data.num_workers"]]
    assert len(one_thread) == 1, "measured once"
    assert r.budget.trials_used == len(loader.trials) == r.budget.trials_run_now


def test_a_range_that_moves_neither_the_speed_nor_the_waste_is_not_grown(tmp_path):
    """Workers that leave a 30% data wait where it was and read a little below the
    incumbent (within the noise): the range's best sits at its top, but nothing says more
    workers would help, and the range is not grown (it had grown to 123)."""

    def speed(c):
        return 100.0 * (0.97 if c.data.num_workers else 1.0)

    stages = {"data": 0.3, "forward": 0.3, "backward": 0.3, "optimizer": 0.1}
    r = run_agent(FakeRunner(speed, noise=0.01, stages=lambda c: stages), tmp_path, only=("dataloader",))
    step = r.steps[0]
    top = max(load_recipes()[0].space("cpu", machine.cores(), 32)["data.num_workers"])
    assert not [t for t in step.trials if t.config["data.num_workers"] > top], [t.changes for t in step.trials]
    assert any("range not grown" in g for g in step.grown), step.grown


def test_a_waste_whose_whole_removal_the_noise_could_not_confirm_gets_no_trials(tmp_path):
    """A 5.5% data wait, at most 1.058x if workers removed all of it: within 3% of a 1.03
    margin, what a comparison cannot confirm (overhead_bound's 5% wait got a loader round
    in every run, and nothing was kept). No loader trial; the stop says what is left."""

    def speed(c):
        return 100.0 * (1.04 if c.data.num_workers else 1.0)

    stages = {"data": 0.055, "forward": 0.4, "backward": 0.4, "optimizer": 0.145}
    r = run_agent(FakeRunner(speed, noise=0.005, stages=lambda c: stages), tmp_path, only=("dataloader",))
    assert not r.steps, [s.recipe for s in r.steps]
    assert "input 6% (at most 1.06x)" in r.stop_reason and "what the noise can resolve" in r.stop_reason, \
        r.stop_reason



def test_a_fit_rules_out_what_only_saves_more_memory():
    """Once bf16 with micro-batch 512 fits (the benchmark's memory case), adding
    checkpointing (which alone read 0.75 of the baseline: it recomputes) or halving the
    micro-batch only saves memory no longer needed, and is not measured (one run measured
    bf16, 512 and checkpointing as its sixth trial); adding a knob that read faster alone
    is still a candidate, and so is a different precision."""
    from autotune.fit import _dominated

    known = {("precision.amp", "bf16"): (0.6, 1.3), ("memory.micro_batch_size", 512): (0.62, 0.95),
             ("memory.micro_batch_size", 256): (0.45, 0.8), ("memory.activation_checkpointing", True): (0.52, 0.75),
             ("optimizer.impl", "fused"): (1.0, 1.1)}
    sized = {"memory.micro_batch_size"}
    fit = {"precision.amp": "bf16", "memory.micro_batch_size": 512}
    assert _dominated({**fit, "memory.activation_checkpointing": True}, fit, sized, known)
    assert _dominated({**fit, "memory.micro_batch_size": 256}, fit, sized, known)
    assert not _dominated({**fit, "optimizer.impl": "fused"}, fit, sized, known)
    assert not _dominated({"precision.amp": "bf16", "memory.activation_checkpointing": True}, fit, sized, known)
    assert not _dominated(fit, fit, sized, known)
    # Without bf16 (which read faster alone) and with a smaller micro-batch: only slower.
    assert _dominated({"memory.micro_batch_size": 256}, fit, sized, known)
    assert _dominated({"memory.micro_batch_size": 256, "memory.activation_checkpointing": True}, fit, sized, known)
    # Without the micro-batch (the whole batch: larger), or without a knob that read slower alone: maybe faster.
    assert not _dominated({"memory.activation_checkpointing": True}, fit, sized, known)
    slow = {"precision.amp": "bf16", "memory.activation_checkpointing": True}
    assert not _dominated({"precision.amp": "bf16", "memory.micro_batch_size": 256}, slow, sized, known)


def test_a_kept_change_that_a_later_one_turned_into_a_loss_is_undone(tmp_path, monkeypatch):
    """One thread gains 20% on the eager default and is kept; the fused optimizer kept after
    it runs its kernel wide, and with it the thread limit costs 25% (gpt, s35: the judge read
    the final config 0.84 of the same at the default threads). The last round undoes the
    thread limit in the final config, measures it like any candidate and keeps the undo; the
    recommendations no longer list the thread limit as kept."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        fused, one = c.optimizer.impl == "fused", c.backend.num_threads == 1
        return 100.0 * (1.6 if fused else 1.0) * ((0.8 if fused else 1.2) if one else 1.0)

    r = run_agent(FakeRunner(speed, noise=0.002, stages=lambda c: COMPUTE_ONLY), tmp_path,
                  only=("threads", "optimizer-impl"))
    steps = [(s.recipe, s.accepted) for s in r.steps]
    assert steps == [("threads", True), ("optimizer-impl", True), ("undo-threads", True),
                     ("undo-optimizer-impl", False)], steps  # fused was kept beside the thread limit: checked too
    assert r.final_config["backend.num_threads"] is None and r.final_config["optimizer.impl"] == "fused"
    assert r.speedup.ratio > 1.5
    kept = {x.recipe: x for x in r.recommendations}
    assert not kept["threads"].accepted and "undone in round 3" in kept["threads"].reason
    assert kept["optimizer-impl"].accepted and kept["undo-threads"].accepted


def test_undoing_stops_at_the_first_kept_change_that_holds(tmp_path, monkeypatch):
    """Three changes kept, each still a gain in the final config: the oldest is undone once
    (rejected: it held) and the younger ones are not undone at all (their comparisons were
    against configs closer to the final one): one trial, not two."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        return 100.0 * (1.5 if c.optimizer.impl == "fused" else 1.0) * (1.3 if c.backend.num_threads == 1 else 1.0) \
            * (1.2 if c.compile.mode == "default" else 1.0)

    r = run_agent(FakeRunner(speed, noise=0.002, stages=lambda c: COMPUTE_ONLY), tmp_path,
                  only=("optimizer-impl", "threads", "compile"))
    undoes = [(s.recipe, s.accepted) for s in r.steps if s.recipe.startswith("undo-")]
    kept = [s.recipe for s in r.steps if s.accepted]
    assert len(kept) == 3, [(s.recipe, s.accepted, s.reason) for s in r.steps]
    assert undoes == [("undo-" + kept[0], False)], undoes


def test_a_round_whose_trials_were_all_cut_as_far_slower_says_so(tmp_path, monkeypatch):
    """Undoing a kept change that gains 5x runs, at a fifth of the current config's speed,
    and is stopped after its first window: the round says it was far slower, not that it
    failed (the README's input_bound run said "every trial was infeasible or failed" of its
    undone loader, 456 samples/s against 2,772)."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        return 100.0 * (5.0 if c.backend.num_threads == 1 else 1.0) * (1.5 if c.optimizer.impl == "fused" else 1.0)

    r = run_agent(FakeRunner(speed, noise=0.01, stages=lambda c: COMPUTE_ONLY), tmp_path,
                  only=("threads", "optimizer-impl"))
    undo = r.steps[-1]
    assert undo.recipe == "undo-threads" and not undo.accepted, [(s.recipe, s.reason) for s in r.steps]
    assert [t.state.value for t in undo.trials] == ["slow"]
    assert undo.reason.startswith("every trial was far slower than the current config"), undo.reason
