"""Each diagnosis rule on synthetic summaries: it fires past its threshold, not before, in
its order, and the verdict carries the numbers (and thresholds) that decided it."""

from __future__ import annotations

import importlib

import pytest

from autotune.clock import STAGES
from autotune.config import TrainConfig
from autotune.diagnose import diagnose
from autotune.record import Bottleneck, Signals, StageTime, StepTime, Summary

# The module (its thresholds): `autotune.diagnose` as an attribute is the re-exported function.
d = importlib.import_module("autotune.diagnose")

STEP_S = 0.02
# A plain compute-bound step: no data wait, no copies, no overhead signals.
COMPUTE = {"forward": 0.45, "backward": 0.45, "optimizer": 0.1}
BIG_OPS = {"ops_per_step": 50, "mean_op_us": 400.0, "syncs_per_step": 0.0, "comm_share": 0.0}


def summary(shares: dict[str, float] | None = None, peak: int | None = 1000, **signals) -> Summary:
    """A summary with these stage shares (the rest of the six stages at 0) and these signals."""
    shares = {**dict.fromkeys(STAGES, 0.0), **(COMPUTE if shares is None else shares)}
    sig = {**BIG_OPS, **signals}
    return Summary(
        config=TrainConfig().flat(), step_time_s=StepTime(median=STEP_S, p90=STEP_S, mean=STEP_S),
        samples_per_s=1000.0, windows_samples_per_s=[1000.0, 1000.0], window_cv=0.0,
        stages={k: StageTime(s=STEP_S * v, share=v) for k, v in shares.items()},
        peak_memory_bytes=peak, signals=Signals(profiled_steps=3, **sig), measured_steps=10,
    )


def fires(v, cls: Bottleneck) -> bool:
    """Whether the rule for `cls` fired: its waste is listed in the verdict."""
    return cls in [w.cls for w in v.wastes]


def quiet(v) -> bool:
    """No rule fired: the verdict is compute with nothing beside it."""
    return v.bottleneck is Bottleneck.COMPUTE and [w.cls for w in v.wastes] == [Bottleneck.COMPUTE]


def with_data(share: float, **rest) -> dict[str, float]:
    """Stage shares with `share` waiting for data and the rest split as a compute step."""
    out = {k: v * (1 - share - sum(rest.values())) for k, v in COMPUTE.items()}
    return {**out, "data": share, **rest}


# --- each rule -----------------------------------------------------------------------------


def test_plain_step_is_compute_bound_naming_its_slowest_stage():
    v = diagnose(summary({"forward": 0.6, "backward": 0.3, "optimizer": 0.1}), "cpu")
    assert quiet(v)
    assert v.slowest_stage == "forward"
    assert "forward" in v.reason


def test_input_above_the_5_percent_line():
    v = diagnose(summary(with_data(0.06)), "cpu")
    assert fires(v, Bottleneck.INPUT)
    assert v.evidence["data_share"] == pytest.approx(0.06)
    assert v.evidence["input_threshold"] == d.INPUT_SHARE == 0.05
    assert "6%" in v.waste(Bottleneck.INPUT).reason and "5%" in v.waste(Bottleneck.INPUT).reason


@pytest.mark.parametrize("share", [0.0, 0.04, 0.05])
def test_input_at_or_below_the_5_percent_line_is_not_input(share):
    v = diagnose(summary(with_data(share)), "cpu")
    assert quiet(v)
    assert v.evidence["data_share"] == pytest.approx(share)


def test_input_bound_step_names_data_as_slowest_when_it_dominates():
    v = diagnose(summary(with_data(0.84)), "cpu")
    assert fires(v, Bottleneck.INPUT)
    assert v.slowest_stage == "data"


def test_communication_above_10_percent():
    v = diagnose(summary(comm_share=0.25), "cpu")
    assert fires(v, Bottleneck.COMMUNICATION)
    assert v.evidence["comm_share"] == 0.25
    assert v.evidence["comm_threshold"] == d.COMM_SHARE
    assert "25%" in v.reason
    assert quiet(diagnose(summary(comm_share=0.10), "cpu"))
    assert quiet(diagnose(summary(comm_share=None), "cpu"))


def test_transfer_when_h2d_share_is_above_10_percent():
    v = diagnose(summary(with_data(0.0, h2d=0.2)), "cuda", memory_limit=None)
    assert fires(v, Bottleneck.TRANSFER)
    assert v.evidence["h2d_share"] == pytest.approx(0.2)
    assert v.evidence["h2d_threshold"] == d.H2D_SHARE
    assert "20%" in v.reason
    assert fires(diagnose(summary(with_data(0.0, h2d=0.2)), "cpu"), Bottleneck.TRANSFER)
    assert quiet(diagnose(summary(with_data(0.0, h2d=0.09)), "cpu"))


def test_transfer_from_pageable_copies_on_cuda_only():
    shares = with_data(0.0, h2d=0.05)
    v = diagnose(summary(shares, pageable_copies_per_step=2.0, gpu_busy=0.9, short_kernel_share=0.1), "cuda")
    assert fires(v, Bottleneck.TRANSFER)
    assert v.evidence["pageable_copies_per_step"] == 2.0
    # the same numbers on CPU: pageable copies are not a CPU concern
    assert quiet(diagnose(summary(shares, pageable_copies_per_step=2.0), "cpu"))
    # pageable copies but a negligible copy time: not transfer-bound
    tiny = with_data(0.0, h2d=0.01)
    assert quiet(diagnose(summary(tiny, pageable_copies_per_step=2.0, gpu_busy=0.9), "cuda"))


def test_sync_at_one_per_step():
    v = diagnose(summary(syncs_per_step=1.0), "cpu")
    assert fires(v, Bottleneck.SYNC)
    assert v.evidence["syncs_per_step"] == 1.0
    assert v.evidence["sync_threshold"] == d.SYNCS_PER_STEP
    assert "1.0 host-device syncs per step" in v.waste(Bottleneck.SYNC).reason
    assert "on CPU" in v.waste(Bottleneck.SYNC).reason
    vc = diagnose(summary(syncs_per_step=3.0, gpu_busy=0.9), "cuda")
    assert fires(vc, Bottleneck.SYNC) and "on CPU" not in vc.reason


@pytest.mark.parametrize("syncs", [0.0, 0.5, 0.99, None])
def test_fewer_than_one_sync_per_step_is_not_sync(syncs):
    assert quiet(diagnose(summary(syncs_per_step=syncs), "cpu"))


def test_cpu_launch_many_short_ops():
    v = diagnose(summary(ops_per_step=500, mean_op_us=12.0), "cpu")
    assert fires(v, Bottleneck.LAUNCH)
    assert v.evidence["ops_per_step"] == 500 and v.evidence["mean_op_us"] == 12.0
    assert v.evidence["cpu_ops_per_step_threshold"] == d.CPU_OPS_PER_STEP
    assert v.evidence["cpu_mean_op_us_threshold"] == d.CPU_MEAN_OP_US
    assert "500 ops per step" in v.waste(Bottleneck.LAUNCH).reason and "12.0 us" in v.waste(Bottleneck.LAUNCH).reason
    # exactly at the op-count line still fires (>=)
    assert fires(diagnose(summary(ops_per_step=200, mean_op_us=12.0), "cpu"), Bottleneck.LAUNCH)


@pytest.mark.parametrize("ops, us", [(150, 12.0), (500, 40.0), (500, 200.0), (None, 12.0), (500, None)])
def test_cpu_launch_needs_both_many_ops_and_short_ops(ops, us):
    assert quiet(diagnose(summary(ops_per_step=ops, mean_op_us=us), "cpu"))


def test_cpu_launch_rule_does_not_apply_on_cuda():
    v = diagnose(summary(ops_per_step=500, mean_op_us=12.0, gpu_busy=0.9, short_kernel_share=0.1), "cuda")
    assert quiet(v)


def test_cuda_launch_idle_gpu_with_short_kernels():
    v = diagnose(summary(gpu_busy=0.3, short_kernel_share=0.8), "cuda")
    assert fires(v, Bottleneck.LAUNCH)
    assert v.evidence["gpu_busy"] == 0.3
    assert v.evidence["short_kernel_share"] == 0.8
    assert v.evidence["gpu_busy_threshold"] == d.GPU_BUSY
    assert "30%" in v.reason and "short kernels" in v.reason


@pytest.mark.parametrize("busy, short", [(0.7, 0.8), (0.3, 0.4), (0.3, None), (None, 0.8)])
def test_cuda_launch_needs_an_idle_gpu_and_short_kernels(busy, short):
    assert quiet(diagnose(summary(gpu_busy=busy, short_kernel_share=short), "cuda"))


def test_cuda_signals_do_not_fire_on_cpu():
    assert quiet(diagnose(summary(gpu_busy=0.3, short_kernel_share=0.8), "cpu"))


def test_memory_over_90_percent_of_the_limit():
    v = diagnose(summary(peak=950), "cpu", memory_limit=1000)
    assert fires(v, Bottleneck.MEMORY)
    assert v.evidence["peak_memory_bytes"] == 950
    assert v.evidence["memory_limit_bytes"] == 1000
    assert v.evidence["memory_threshold"] == d.MEMORY_FRACTION
    assert "95%" in v.waste(Bottleneck.MEMORY).reason and "90%" in v.waste(Bottleneck.MEMORY).reason


@pytest.mark.parametrize("peak, limit", [(900, 1000), (500, 1000), (10**12, None), (None, 1000)])
def test_memory_at_or_under_90_percent_or_without_a_limit_is_not_memory(peak, limit):
    assert quiet(diagnose(summary(peak=peak), "cpu", memory_limit=limit))


def test_out_of_memory_is_memory_bound():
    v = diagnose(summary(with_data(0.5)), "cpu", oom=True)
    assert fires(v, Bottleneck.MEMORY) and "out of memory" in v.reason


# --- the bottleneck: the largest share of the step, compute included -------------------


def test_a_small_waste_is_listed_beside_a_compute_bound_step():
    v = diagnose(summary(with_data(0.06)), "cpu")  # a 6% data wait: input fires, compute holds 94%
    assert v.bottleneck is Bottleneck.COMPUTE
    assert [w.cls for w in v.wastes] == [Bottleneck.INPUT, Bottleneck.COMPUTE]


def test_a_waste_larger_than_the_models_own_work_is_the_bottleneck():
    assert diagnose(summary(with_data(0.6)), "cpu").bottleneck is Bottleneck.INPUT
    # tiny ops covering 90% of a CPU step: launch overhead, not the model's own work
    assert diagnose(summary(ops_per_step=1500, mean_op_us=12.0), "cpu").bottleneck is Bottleneck.LAUNCH


def test_memory_near_the_limit_is_listed_first_and_a_config_over_it_is_memory_bound():
    v = diagnose(summary(with_data(0.5), peak=990), "cpu", memory_limit=1000)
    assert v.wastes[0].cls is Bottleneck.MEMORY
    assert v.bottleneck is Bottleneck.INPUT and v.slowest_stage == "data"
    assert diagnose(summary(with_data(0.5), peak=1100), "cpu", memory_limit=1000).bottleneck is Bottleneck.MEMORY


def test_the_largest_waste_is_the_bottleneck_and_every_fired_rule_is_listed():
    s = summary(with_data(0.3, h2d=0.2), comm_share=0.5, syncs_per_step=4.0, ops_per_step=900, mean_op_us=5.0)
    v = diagnose(s, "cpu")
    assert v.bottleneck is Bottleneck.COMMUNICATION  # 50% of the step, more than the 30% data wait
    listed = [w.cls for w in v.wastes]
    assert listed[0] is Bottleneck.COMMUNICATION and Bottleneck.TRANSFER in listed
    assert set(listed) >= {Bottleneck.SYNC, Bottleneck.LAUNCH} and listed[-1] is Bottleneck.COMPUTE
    shares = [w.share for w in v.wastes[:-1]]
    assert shares == sorted(shares, reverse=True)


def test_equal_shares_keep_the_rule_order():
    s = summary(with_data(0.2, h2d=0.2), syncs_per_step=4.0)
    assert [w.cls for w in diagnose(s, "cpu").wastes][:2] == [Bottleneck.INPUT, Bottleneck.TRANSFER]


def test_a_cpu_sync_costs_no_share_and_is_never_the_bottleneck_there():
    v = diagnose(summary(with_data(0.0, h2d=0.2), syncs_per_step=4.0), "cpu")
    assert v.wastes[0].cls is Bottleneck.TRANSFER and v.waste(Bottleneck.SYNC).share == 0.0
    assert diagnose(summary(syncs_per_step=2.0), "cpu").bottleneck is Bottleneck.COMPUTE
    s = summary(syncs_per_step=2.0, gpu_busy=0.2, short_kernel_share=0.9)
    assert diagnose(s, "cuda").bottleneck is Bottleneck.SYNC  # GPU idle 80%: ties with launch, sync first


# --- evidence and slowest stage ------------------------------------------------------------

CASES = [
    (summary(), "cpu", None),
    (summary(with_data(0.3)), "cpu", None),
    (summary(peak=999), "cpu", 1000),
    (summary(comm_share=0.5), "cpu", None),
    (summary(with_data(0.0, h2d=0.3)), "cpu", None),
    (summary(syncs_per_step=2.0), "cpu", None),
    (summary(ops_per_step=900, mean_op_us=5.0), "cpu", None),
    (summary(gpu_busy=0.2, short_kernel_share=0.9), "cuda", None),
    (summary(), "cuda", 10**9),
]


@pytest.mark.parametrize("s, device, limit", CASES)
def test_evidence_always_carries_every_threshold(s, device, limit):
    v = diagnose(s, device, memory_limit=limit)
    ev = v.evidence
    assert ev["input_threshold"] == d.INPUT_SHARE
    assert ev["h2d_threshold"] == d.H2D_SHARE
    assert ev["sync_threshold"] == d.SYNCS_PER_STEP
    assert ev["comm_threshold"] == d.COMM_SHARE
    assert ev["memory_threshold"] == d.MEMORY_FRACTION
    assert ev["memory_limit_bytes"] == limit
    if device == "cuda":
        assert ev["gpu_busy_threshold"] == d.GPU_BUSY
        assert "cpu_ops_per_step_threshold" not in ev
    else:
        assert ev["cpu_mean_op_us_threshold"] == d.CPU_MEAN_OP_US
        assert ev["cpu_ops_per_step_threshold"] == d.CPU_OPS_PER_STEP
        assert "gpu_busy_threshold" not in ev
    assert ev["stage_shares"] == {k: pytest.approx(sh.share, abs=1e-4) for k, sh in s.stages.items()}
    assert v.reason


@pytest.mark.parametrize("s, device, limit", CASES)
def test_slowest_stage_is_the_largest_share(s, device, limit):
    v = diagnose(s, device, memory_limit=limit)
    assert v.slowest_stage == max(s.stages, key=lambda k: s.stages[k].share)


@pytest.mark.parametrize("stage", ["data", "h2d", "forward", "backward", "optimizer", "other"])
def test_slowest_stage_follows_the_largest_share(stage):
    shares = {**dict.fromkeys(STAGES, 0.1), stage: 0.5}
    assert diagnose(summary(shares), "cpu").slowest_stage == stage


def test_verdict_round_trips_through_json():
    v = diagnose(summary(with_data(0.3)), "cpu", memory_limit=10**9)
    again = type(v).model_validate_json(v.model_dump_json())
    assert again == v


def test_on_cuda_the_idle_time_spent_waiting_for_data_is_inputs_not_launchs():
    """Seen on an H200 (resnet_jpeg): the GPU busy 5% of the step, data 51%, mostly short
    kernels. The idle GPU waits for the next batch half the time: the step is input-bound
    first, and launch overhead owns only the idle time that is left (44%)."""
    s = summary(with_data(0.51, h2d=0.02), gpu_busy=0.05, short_kernel_share=0.76)
    v = diagnose(s, "cuda")
    assert v.bottleneck is Bottleneck.INPUT
    assert v.waste(Bottleneck.LAUNCH).share == pytest.approx(0.95 - 0.51 - 0.02)
    # a step that does not wait for data keeps all of the idle time as launch overhead
    assert diagnose(summary(gpu_busy=0.05, short_kernel_share=0.76), "cuda").waste(Bottleneck.LAUNCH).share == \
        pytest.approx(0.95)
