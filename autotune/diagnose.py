"""The bottleneck classifier: a class, the slowest stage, and the numbers that decided it.

Thresholds start from what public tools use, and each says where it comes from. Rules are
checked in order; the first that fires names the bottleneck, and every rule's numbers are
kept as evidence either way.
"""

from __future__ import annotations

from typing import Any

from .record import Bottleneck, Summary, Verdict

__all__ = ["ADVICE", "Bottleneck", "Verdict", "acceptable", "diagnose"]

# Data wait above 5% of the step: the PyTorch profiler TensorBoard plugin's input-bound rule.
INPUT_SHARE = 0.05
# Collectives above 10% of the step: communication-bound (HTA's and DeepSpeed's rule of thumb).
COMM_SHARE = 0.10
# Peak memory above 90% of the limit: memory-bound (no headroom for a larger step).
MEMORY_FRACTION = 0.90
# Host-to-device copies above 10% of the step, or any from pageable memory on CUDA.
H2D_SHARE = 0.10
# At least one host-device sync (`.item()`, `.cpu()`, ...) per step inside the user's code.
SYNCS_PER_STEP = 1.0
# GPU busy under 50% with most kernels shorter than 10 us: launch-bound (profiler plugin).
GPU_BUSY = 0.50
SHORT_KERNEL_SHARE = 0.5
# CPU: framework overhead dominates when the average top-level op takes under 40 us and a
# step runs hundreds of them (dispatch costs a few us per op; big matmuls take ms).
CPU_MEAN_OP_US = 40.0
CPU_OPS_PER_STEP = 200


# What to do where no recipe can act: the fix is in the user's code.
ADVICE = {
    Bottleneck.SYNC: "move the host read out of the step: keep checks on the device (torch.where, "
                     "torch.isfinite(...).all() without .item()), and log losses every N steps instead of every step.",
    Bottleneck.COMMUNICATION: "overlap gradient all-reduce with backward (DDP bucket_cap_mb, gradient_as_bucket_view), "
                              "or accumulate locally under no_sync() between optimizer steps.",
}


def diagnose(summary: Summary, device: str, memory_limit: int | None = None, oom: bool = False) -> Verdict:
    """Classify one measurement summary."""
    sig = summary.signals.model_dump()
    stages = {k: v.share for k, v in summary.stages.items()}
    slowest = max(stages, key=stages.get)
    peak = summary.peak_memory_bytes
    ev: dict[str, Any] = {
        "stage_shares": {k: round(v, 4) for k, v in stages.items()},
        "data_share": round(stages["data"], 4), "input_threshold": INPUT_SHARE,
        "h2d_share": round(stages["h2d"], 4), "h2d_threshold": H2D_SHARE,
        "syncs_per_step": sig.get("syncs_per_step"), "sync_threshold": SYNCS_PER_STEP,
        "comm_share": sig.get("comm_share"), "comm_threshold": COMM_SHARE,
        "peak_memory_bytes": peak, "memory_limit_bytes": memory_limit, "memory_threshold": MEMORY_FRACTION,
        "ops_per_step": sig.get("ops_per_step"), "mean_op_us": sig.get("mean_op_us"),
    }
    if device == "cuda":
        ev.update(gpu_busy=sig.get("gpu_busy"), gpu_busy_threshold=GPU_BUSY,
                  short_kernel_share=sig.get("short_kernel_share"),
                  pageable_copies_per_step=sig.get("pageable_copies_per_step"))
    else:
        ev.update(cpu_mean_op_us_threshold=CPU_MEAN_OP_US, cpu_ops_per_step_threshold=CPU_OPS_PER_STEP)

    def verdict(b: Bottleneck, reason: str) -> Verdict:
        return Verdict(bottleneck=b, slowest_stage=slowest, evidence=ev, reason=reason)

    if oom:
        return verdict(Bottleneck.MEMORY, "the step ran out of memory")
    if memory_limit and peak is not None and peak > MEMORY_FRACTION * memory_limit:
        return verdict(Bottleneck.MEMORY, f"peak memory is {peak / memory_limit:.0%} of the limit (> {MEMORY_FRACTION:.0%})")
    if stages["data"] > INPUT_SHARE:
        return verdict(Bottleneck.INPUT, f"the step waits for data {stages['data']:.0%} of the time (> {INPUT_SHARE:.0%})")
    if (sig.get("comm_share") or 0) > COMM_SHARE:
        return verdict(Bottleneck.COMMUNICATION, f"collectives take {sig['comm_share']:.0%} of the step (> {COMM_SHARE:.0%})")
    if stages["h2d"] > H2D_SHARE or (device == "cuda" and (sig.get("pageable_copies_per_step") or 0) > 0 and stages["h2d"] > 0.02):
        return verdict(Bottleneck.TRANSFER, f"host-to-device copies take {stages['h2d']:.0%} of the step")
    if (sig.get("syncs_per_step") or 0) >= SYNCS_PER_STEP:
        note = "" if device == "cuda" else " (on CPU a sync costs little; on a GPU it stalls the launch queue)"
        return verdict(Bottleneck.SYNC, f"{sig['syncs_per_step']:.1f} host-device syncs per step in the model/loss code{note}")
    if device == "cuda":
        if (sig.get("gpu_busy") or 1) < GPU_BUSY and (sig.get("short_kernel_share") or 0) > SHORT_KERNEL_SHARE:
            return verdict(Bottleneck.LAUNCH, f"the GPU is busy {sig['gpu_busy']:.0%} of the time with mostly short kernels")
    elif (sig.get("mean_op_us") or 1e9) < CPU_MEAN_OP_US and (sig.get("ops_per_step") or 0) >= CPU_OPS_PER_STEP:
        return verdict(Bottleneck.LAUNCH, f"{sig['ops_per_step']:.0f} ops per step averaging {sig['mean_op_us']:.1f} us: dispatch overhead dominates")
    return verdict(Bottleneck.COMPUTE, f"the step is spent in {slowest} and no overhead rule fired")


def acceptable(v: Verdict) -> bool:
    """Whether the slowest stage is acceptable: the step is bound by useful compute.

    Every other class names waste a recipe can remove (waiting for data, copies, syncs,
    dispatch, memory pressure, collectives). A compute-bound step still has compute recipes
    (AMP, compile, channels_last); the agent stops once those are tried.
    """
    return v.bottleneck is Bottleneck.COMPUTE
