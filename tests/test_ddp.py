"""DDP: the distributed.* keys, 2-rank measurements over gloo on CPU, failures that leave no
rank behind, the ddp recipe, `autotune train` on every rank, and the example end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import autotune
from autotune import TrainConfig
from autotune.apply import ddp_module, wrap_ddp
from autotune.config import from_dict, from_flat
from autotune.diagnose import diagnose
from autotune.errors import ConfigError, TrialFailed, UserError
from autotune.measure import Protocol, Session
from autotune.record import Bottleneck
from autotune.recipes import load_recipes
from autotune.runner import Runner
from autotune.workload import facts, load_workload, with_world_size
from workloads import make

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_comm_bound.py"
SMALL = Protocol(warmup_steps=1, steps=4, windows=2, profile_steps=1)
CPU = torch.device("cpu")

TINY = """
import os
COUNT = [0]

def workload():
    return make(name="tiny-ddp", world_size=2, dataset=lambda: Vectors(256))

def _model():
    if os.environ.get("DDP_PIDS"):
        with open(os.environ["DDP_PIDS"], "a") as f:
            f.write(f"{os.getpid()}\\n")
    return mlp()

def _loss(model, batch):
    COUNT[0] += 1
    if torch.distributed.get_rank() == 1 and COUNT[0] > 3:
        raise RuntimeError("boom on rank 1")
    return ce_loss(model, batch)

def failing():
    return make(name="tiny-ddp-failing", world_size=2, dataset=lambda: Vectors(256), model=_model, loss=_loss)

def _hang(model, batch):
    if torch.distributed.get_rank() == 1:
        import time
        time.sleep(3600)
    return ce_loss(model, batch)

def hanging():
    return make(name="tiny-ddp-hanging", world_size=2, dataset=lambda: Vectors(256), model=_model, loss=_hang)
"""


@pytest.fixture
def tiny(tiny_target):
    return str(tiny_target("tiny_ddp.py", TINY))


# --- config and workload -----------------------------------------------------------------

def test_distributed_keys_default_to_one_process_without_ddp():
    flat = TrainConfig().flat()
    assert {k: v for k, v in flat.items() if k.startswith("distributed.")} == {
        "distributed.world_size": 1, "distributed.bucket_cap_mb": 25.0,
        "distributed.gradient_as_bucket_view": False, "distributed.static_graph": False}
    cfg = from_flat({"distributed.world_size": 2, "distributed.bucket_cap_mb": 5,
                     "distributed.gradient_as_bucket_view": True, "distributed.static_graph": True})
    assert cfg.distributed.bucket_cap_mb == 5.0
    assert from_dict({"data": {"num_workers": 0}}).distributed.world_size == 1  # an old tuned.yaml


def test_invalid_distributed_values_are_all_listed_at_once():
    with pytest.raises(ConfigError) as info:
        from_flat({"distributed.world_size": 0, "distributed.bucket_cap_mb": 0, "distributed.static_graph": "often"})
    text = " ".join(info.value.errors)
    assert len(info.value.errors) == 3, info.value.errors
    assert "distributed.world_size" in text and "distributed.bucket_cap_mb" in text and "distributed.static_graph" in text


def test_ddp_settings_need_more_than_one_process():
    with pytest.raises(ConfigError) as info:
        from_flat({"distributed.bucket_cap_mb": 50, "distributed.static_graph": True,
                   "data.prefetch_factor": 2})
    errors = info.value.errors
    assert any("distributed.bucket_cap_mb needs distributed.world_size > 1" in e for e in errors)
    assert any("distributed.static_graph needs distributed.world_size > 1" in e for e in errors)
    assert any("data.prefetch_factor" in e for e in errors)  # listed beside the other rules


def test_workload_world_size_must_divide_the_global_batch():
    with pytest.raises(UserError, match="must divide evenly over world_size 3"):
        make(world_size=3)
    with pytest.raises(UserError, match="world_size must be a positive int"):
        make(world_size=0)
    wl = make(world_size=2)
    assert wl.rank_batch == 8 and wl.base_config().distributed.world_size == 2
    assert facts(wl)["distributed"] and not facts(make())["distributed"]
    assert with_world_size(wl, 4).rank_batch == 4


def test_a_config_for_another_world_size_is_refused(tiny):
    wl = load_workload(tiny)
    with pytest.raises(TrialFailed, match="differs from the workload's world_size 2"):
        Runner(wl, tiny, CPU, SMALL, isolate=False).measure(TrainConfig())


def test_wrap_ddp_leaves_one_process_alone_and_needs_a_process_group():
    model = torch.nn.Linear(2, 2)
    assert wrap_ddp(model, TrainConfig()) is model
    with pytest.raises(ConfigError, match="needs an initialised process group"):
        wrap_ddp(model, from_flat({"distributed.world_size": 2}))


def test_the_ddp_recipe_applies_only_to_a_distributed_workload():
    ddp = next(r for r in load_recipes() if r.name == "ddp")
    assert ddp.targets == (Bottleneck.COMMUNICATION,)
    assert set(ddp.space("cpu", 2, 8)) == {"distributed.bucket_cap_mb", "distributed.gradient_as_bucket_view",
                                           "distributed.static_graph"}
    assert ddp.applies("cpu", facts(make(world_size=2)))[0]
    ok, why = ddp.applies("cpu", facts(make()))
    assert not ok and "world_size > 1" in why
    out = subprocess.run([sys.executable, "-m", "autotune", "recipes"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ddp" in out.stdout and "communication" in out.stdout


# --- measuring two ranks ---------------------------------------------------------------------

def test_two_ranks_measure_per_rank_stages_communication_and_global_throughput(tiny):
    wl = load_workload(tiny)
    cfg = wl.base_config().with_changes({"distributed.bucket_cap_mb": 3})
    session = Session(wl, cfg, CPU, SMALL)
    try:
        ddp = ddp_module(session.trainer.step_model)
        assert ddp is not None and ddp.bucket_bytes_cap == 3 * 1024 * 1024  # the knob reaches DDP
        for _ in range(SMALL.windows):
            w = session.window()
            # global: both ranks' samples (4 steps x 8 per rank x 2 ranks) over the slower rank's time
            assert w.samples == SMALL.steps * wl.batch_size
            peer = session.result.peer_windows[0][-1]
            assert peer.samples == SMALL.steps * wl.rank_batch and w.wall_s >= peer.wall_s
        session.profile()
    finally:
        session.close()
    s = session.result.summary()
    assert s.world_size == 2 and len(s.rank_stages) == 2
    for rank in s.rank_stages:
        assert rank["communication"].s > 0 and abs(sum(v.share for v in rank.values()) - 1) < 1e-6
    assert s.stages["communication"].share > 0
    total = sum(w.samples for w in session.result.windows)
    assert s.samples_per_s == pytest.approx(total / sum(w.wall_s + w.epoch_cost_s for w in session.result.windows))
    assert s.signals.allreduce_bytes_per_step == sum(p.numel() * 4 for p in session.trainer.model.parameters())
    verdict = diagnose(s, "cpu")
    if s.stages["communication"].share > 0.2:  # a 2 KB all-reduce over loopback still costs ms
        waste = verdict.waste(Bottleneck.COMMUNICATION)
        assert waste is not None and waste.evidence["allreduce_bytes_per_step"] > 0
        assert len(waste.evidence["rank_communication_shares"]) == 2


def test_isolated_trial_runs_the_ranks_and_applies_the_knobs(tiny):
    wl = load_workload(tiny)
    cfg = wl.base_config().with_changes({"distributed.gradient_as_bucket_view": True,
                                         "memory.micro_batch_size": 4})  # accumulation under no_sync()
    s = Runner(wl, tiny, CPU, SMALL, isolate=True, timeout_s=240).measure(cfg)
    assert s.world_size == 2 and len(s.rank_stages) == 2 and s.samples_per_s > 0
    assert s.config["distributed.gradient_as_bucket_view"] is True
    # DDP's static graph cannot start under no_sync(): refused before any rank starts
    with pytest.raises(TrialFailed, match="static_graph cannot be combined with micro-batches"):
        Runner(wl, tiny, CPU, SMALL, isolate=True).measure(cfg.with_changes({"distributed.static_graph": True}))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("isolate", [True, False])
def test_a_rank_that_raises_fails_the_trial_with_its_reason_and_leaves_no_process(tiny, tmp_path, monkeypatch,
                                                                                  isolate):
    pids = tmp_path / "pids.txt"
    monkeypatch.setenv("DDP_PIDS", str(pids))
    target = tiny + ":failing"
    wl = load_workload(target)
    with pytest.raises(TrialFailed) as info:
        Runner(wl, target, CPU, SMALL, isolate=isolate, timeout_s=240).measure(wl.base_config())
    assert "rank 1" in info.value.reason and "boom on rank 1" in info.value.reason
    others = [int(p) for p in pids.read_text().split()] if pids.exists() else []
    others = [p for p in others if p != os.getpid()]
    assert others, "the ranks' processes wrote no pids"
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in others) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in others if _alive(p)]
    assert not torch.distributed.is_initialized()  # in-process rank 0 left its broken group


def test_a_hung_rank_times_the_trial_out_and_every_rank_dies_with_it(tiny, tmp_path, monkeypatch):
    pids = tmp_path / "pids.txt"
    monkeypatch.setenv("DDP_PIDS", str(pids))
    target = tiny + ":hanging"
    wl = load_workload(target)
    with pytest.raises(TrialFailed) as info:
        Runner(wl, target, CPU, SMALL, isolate=True, timeout_s=45).measure(wl.base_config())
    assert info.value.kind.value == "timeout"
    ranks = [int(p) for p in pids.read_text().split()]
    assert len(ranks) == 2  # both ranks had started
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in ranks if _alive(p)]


def test_micro_batches_under_no_sync_keep_the_same_training(tiny):
    from autotune.loop import train_ranks

    wl = load_workload(tiny)
    whole, _ = train_ranks(wl, wl.base_config(), CPU, 0, 6, 1)
    micro, _ = train_ranks(wl, wl.base_config().with_changes({"memory.micro_batch_size": 2}), CPU, 0, 6, 1)
    torch.testing.assert_close(torch.tensor(micro.losses), torch.tensor(whole.losses), rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match="does not divide the per-rank batch 8"):
        train_ranks(wl, wl.base_config().with_changes({"memory.micro_batch_size": 16}), CPU, 0, 2, 0)


def test_train_runs_the_distributed_keys_and_refuses_another_world_size(tiny, tmp_path):
    good = tmp_path / "tuned.yaml"
    autotune.save_config(from_flat({"distributed.world_size": 2, "distributed.bucket_cap_mb": 1}), good)
    run = subprocess.run([sys.executable, "-m", "autotune", "train", tiny, "--config", str(good), "--steps", "4"],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    assert "distributed.bucket_cap_mb=1" in run.stdout
    single = tmp_path / "single.yaml"
    autotune.save_config(TrainConfig(), single)
    bad = subprocess.run([sys.executable, "-m", "autotune", "train", tiny, "--config", str(single), "--steps", "2"],
                         capture_output=True, text=True, timeout=240)
    assert bad.returncode == 2 and "world_size" in bad.stderr and "Traceback" not in bad.stderr
    flag = subprocess.run([sys.executable, "-m", "autotune", "train", tiny, "--config", str(single), "--steps", "2",
                           "--world-size", "1"], capture_output=True, text=True, timeout=240)
    assert flag.returncode == 0, flag.stderr


# --- the example end to end --------------------------------------------------------------

@pytest.mark.slow
def test_profile_of_the_example_says_communication(tmp_path):
    out = tmp_path / "profile.json"
    run = subprocess.run([sys.executable, "-m", "autotune", "profile", str(EXAMPLE), "--windows", "3", "--json",
                          str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    # The all-reduce is a waste the rule finds; whether it or the model's own work holds the
    # larger share of this small example's step depends on the machine's load.
    assert "communication" in [w["class"] for w in doc["diagnosis"]["wastes"]], doc["diagnosis"]["reason"]
    assert doc["measurement"]["world_size"] == 2 and len(doc["measurement"]["rank_stages"]) == 2
    assert "ddp" in doc["recipes"]


@pytest.mark.slow
def test_tune_of_the_example_searches_the_ddp_recipe_or_says_why_not(tmp_path):
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "autotune", "tune", str(EXAMPLE), "--out", str(out), "--budget", "100s",
                          "--windows", "3", "--steps", "6", "--only", "ddp"],
                         capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr
    report = json.loads((out / "report.json").read_text())
    assert "communication" in [w["class"] for w in report["initial_diagnosis"]["wastes"]]
    assert report["baseline"]["config"]["distributed.world_size"] == 2
    assert report["baseline"]["stages"]["communication"]["share"] > 0.1
    tried = [s for s in report["steps"] if s["recipe"] == "ddp"]
    if tried:  # searched: every trial measured on two ranks, and a decision with its reason
        assert tried[0]["accepted"] or tried[0]["reason"]
        assert tried[0]["trials"] or "budget" in tried[0]["reason"]  # none finished: the budget says why
    else:  # not searched: the report says why, with the measured share or the budget
        assert "communication" in report["stop_reason"] or "budget" in report["stop_reason"]
    assert autotune.load_config(out / "tuned.yaml").distributed.world_size == 2


def test_exports_carry_the_world_size_and_state_what_they_cannot():
    from test_export import tuned_report

    from autotune.export import export, hf_kwargs

    report = tuned_report()
    report.final_config = {**report.final_config, "distributed.world_size": 2, "distributed.bucket_cap_mb": 50.0,
                           "distributed.static_graph": True}
    assert "torchrun --standalone --nproc_per_node=2 train.py" in export(report, "torchrun")
    assert "static_graph=True" in export(report, "torchrun")
    acc = export(report, "accelerate", 32)
    assert "num_processes: 2" in acc and ("distributed_type: MULTI_CPU" in acc or "distributed_type: MULTI_GPU" in acc)
    kw = hf_kwargs(report, 32)  # micro-batches of 8 on each of 2 ranks: 2 steps keep the global 32
    assert kw["ddp_bucket_cap_mb"] == 50 and kw["per_device_train_batch_size"] == 8
    assert kw["gradient_accumulation_steps"] == 2
    assert "distributed.static_graph" in export(report, "hf", 32)  # no TrainingArguments key: a code comment
    assert "DDPStrategy(bucket_cap_mb=50.0, static_graph=True)" in export(report, "lightning", 32)
    single = tuned_report()
    assert "--nproc_per_node=1" in export(single, "torchrun")
