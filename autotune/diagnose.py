"""The bottleneck classifier: every waste whose rule fires, ranked, with the numbers that
decided it; the class holding the largest share of the step, compute included, names the bottleneck.

Thresholds start from what public tools use, and each says where it comes from. A share
measured per window carries its 95% interval: a share whose interval straddles its line
is *borderline*, and a borderline rule keeps the state it had in the previous verdict of
the same run (hysteresis), so noise around a line never flips a verdict back and forth.
Each waste carries the most a fix could gain (Amdahl: removing a share `s` of the step
gains at most `1 / (1 - s)`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from .record import Bottleneck, Summary, Verdict, Waste
from .stats import t95
from .units import format_bytes

__all__ = ["ADVICE", "Bottleneck", "Verdict", "Waste", "amdahl", "diagnose", "material"]

# Data wait above 5% of the step: the PyTorch profiler TensorBoard plugin's input-bound rule.
INPUT_SHARE = 0.05
# The loading thread busy on the CPU for at least 80% of its wait: decoding, not storage.
CPU_BOUND_LOADING = 0.80
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
COMPUTE_STAGES = ("forward", "backward", "optimizer", "other")  # `communication` (DDP) is not the model's work

# What to do where no recipe can act: the fix is in the user's code.
ADVICE = {
    Bottleneck.SYNC: "move the host read out of the step: keep checks on the device (torch.where, "
                     "torch.isfinite(...).all() without .item()), and log losses every N steps instead of every step.",
    Bottleneck.COMMUNICATION: "send fewer gradient bytes per sample: a larger global batch (fewer all-reduces per "
                              "sample, accumulating under no_sync()), a DDP compression hook (bf16_compress_hook halves "
                              "the bytes), fewer parameters; with few cores on one machine, one process may beat DDP.",
}


def amdahl(share: float) -> float:
    """The most removing `share` of the step can gain."""
    return 1.0 / max(1e-9, 1.0 - min(share, 0.999999))


# Past the noise margin, how much more a waste's whole removal must gain for a comparison
# to confirm it: a true gain just past the margin is rarely confirmed, so trials on it are wasted.
RESOLVE = 1.03


def resolvable(margin: float) -> float:
    """The least gain a waste's whole removal must promise to be worth trials."""
    return margin * RESOLVE


def clear_gain(margin: float) -> float:
    """A gain past twice the margin: what the comparisons can do more than barely confirm."""
    return 1 + 2 * (margin - 1)


def material(w: Waste, margin: float) -> bool:
    """Whether removing this waste could gain more than the noise can resolve."""
    return w.cls is Bottleneck.MEMORY or (w.max_gain is not None and w.max_gain > resolvable(margin))


def _interval(values: list[float]) -> tuple[float, float]:
    """95% interval of a mean over windows (a point when there is one window)."""
    if len(values) < 2:
        m = values[0] if values else 0.0
        return m, m
    m, half = statistics.fmean(values), t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return m - half, m + half


class _Rules:
    """One summary's numbers, and the rule for each class."""

    def __init__(self, summary: Summary, device: str, memory_limit: int | None, previous: Verdict | None) -> None:
        self.s, self.device, self.limit = summary, device, memory_limit
        self.sig = summary.signals.model_dump()
        self.shares = {k: v.share for k, v in summary.stages.items()}
        self.before = {w.cls for w in previous.wastes} if previous else None

    def _by_share(self, cls: Bottleneck, stage: str, line: float, what: str) -> Waste | None:
        share = self.shares.get(stage, 0.0)
        low, high = _interval([w.get(stage, 0.0) for w in self.s.window_stage_shares] or [share])
        ev = {f"{stage}_share": round(share, 4), "interval": [round(low, 4), round(high, 4)], "threshold": line}
        if low > line:
            fires, borderline = True, False
        elif high <= line:
            fires, borderline = False, False
        else:  # within noise of the line: keep what the previous verdict said
            fires, borderline = (share > line) if self.before is None else (cls in self.before), True
        if not fires:
            return None
        ev["borderline"] = borderline
        return Waste(cls=cls, share=share, max_gain=amdahl(share), evidence=ev,
                     reason=f"{what} {share:.0%} of the step (> {line:.0%}{', within noise of the line' if borderline else ''})")

    def input(self) -> Waste | None:
        w = self._by_share(Bottleneck.INPUT, "data", INPUT_SHARE, "the step waits for data")
        cpu = self.sig.get("data_cpu_share")
        if w is not None and cpu is not None:  # measured only while batches load in the training process
            w.evidence["data_cpu_share"] = round(cpu, 4)
            w.reason += (f"; loading is CPU work ({cpu:.0%} of the wait): workers gain only while cores are free"
                         if cpu >= CPU_BOUND_LOADING else f"; loading waits more than it computes ({cpu:.0%} CPU)")
        return w

    def transfer(self) -> Waste | None:
        pageable = self.device == "cuda" and (self.sig.get("pageable_copies_per_step") or 0) > 0
        w = self._by_share(Bottleneck.TRANSFER, "h2d", 0.02 if pageable else H2D_SHARE, "host-to-device copies take")
        if w is not None:
            w.evidence["pageable_copies_per_step"] = self.sig.get("pageable_copies_per_step")
        return w

    def communication(self) -> Waste | None:
        if "communication" in self.shares:  # DDP: the stage measured against a no-all-reduce reference
            w = self._by_share(Bottleneck.COMMUNICATION, "communication", COMM_SHARE, "gradient all-reduce adds")
            if w is not None:
                sig = self.sig
                w.evidence.update(world_size=sig.get("world_size"), allreduce_bytes_per_step=sig.get("allreduce_bytes_per_step"),
                                  backward_synced_s=sig.get("backward_synced_s"), backward_local_s=sig.get("backward_local_s"),
                                  rank_communication_shares=[round(r["communication"].share, 4) for r in self.s.rank_stages],
                                  rule="communication share = (backward with all-reduce - backward under no_sync) "
                                       "/ backward with all-reduce, of the measured backward")
                sent = format_bytes(sig.get("allreduce_bytes_per_step") or 0)
                w.reason += f"; {sent} of gradients all-reduced per step over {sig.get('world_size')} ranks"
            return w
        share = self.sig.get("comm_share") or 0.0
        if share <= COMM_SHARE:
            return None
        return Waste(cls=Bottleneck.COMMUNICATION, share=share, max_gain=amdahl(share),
                     evidence={"comm_share": share, "threshold": COMM_SHARE},
                     reason=f"collectives take {share:.0%} of the step (> {COMM_SHARE:.0%})")

    def sync(self) -> Waste | None:
        n = self.sig.get("syncs_per_step") or 0.0
        if n < SYNCS_PER_STEP:
            return None
        ev = {"syncs_per_step": n, "threshold": SYNCS_PER_STEP}
        if self.device == "cuda":  # the launch queue drains at each sync: the GPU's idle time is the cost
            share, note = self._gpu_idle(), ""
        else:
            share, note = 0.0, " (on CPU a sync costs little; on a GPU it stalls the launch queue)"
        return Waste(cls=Bottleneck.SYNC, share=share, max_gain=amdahl(share), evidence=ev,
                     reason=f"{n:.1f} host-device syncs per step in the model/loss code{note}")

    def _gpu_idle(self) -> float:
        """The GPU's idle share of the step that the host's launches and syncs leave: not the
        time it waited for the next batch or its copy (the input and transfer rules' share)."""
        idle = 1.0 - (self.sig.get("gpu_busy") or 1.0)
        return max(0.0, idle - self.shares.get("data", 0.0) - self.shares.get("h2d", 0.0))

    def launch(self) -> Waste | None:
        ops, mean_us = self.sig.get("ops_per_step") or 0.0, self.sig.get("mean_op_us")
        if self.device == "cuda":
            busy, short = self.sig.get("gpu_busy") or 1.0, self.sig.get("short_kernel_share") or 0.0
            if not (busy < GPU_BUSY and short > SHORT_KERNEL_SHARE):
                return None
            share = self._gpu_idle()
            reason = f"the GPU is busy {busy:.0%} of the time with mostly short kernels"
            ev = {"gpu_busy": busy, "gpu_busy_threshold": GPU_BUSY, "short_kernel_share": short}
        else:
            if mean_us is None or mean_us >= CPU_MEAN_OP_US or ops < CPU_OPS_PER_STEP:
                return None
            step = self.s.step_time_s.mean or 0.0
            busy = 1.0 - self.shares.get("data", 0.0) - self.shares.get("h2d", 0.0)
            share = min(busy, ops * mean_us * 1e-6 / step) if step else 0.0  # time in tiny ops: what fusing removes
            reason = f"{ops:.0f} ops per step averaging {mean_us:.1f} us: dispatch overhead dominates"
            ev = {"ops_per_step": ops, "mean_op_us": mean_us, "cpu_mean_op_us_threshold": CPU_MEAN_OP_US,
                  "cpu_ops_per_step_threshold": CPU_OPS_PER_STEP}
        return Waste(cls=Bottleneck.LAUNCH, share=share, max_gain=amdahl(share), evidence=ev, reason=reason)

    def memory(self, oom: bool) -> Waste | None:
        peak = self.s.peak_memory_bytes
        if oom:
            return Waste(cls=Bottleneck.MEMORY, share=1.0, max_gain=None, evidence={"oom": True},
                         reason="the step ran out of memory")
        if not (self.limit and peak is not None and peak > MEMORY_FRACTION * self.limit):
            return None
        over = peak > self.limit
        return Waste(cls=Bottleneck.MEMORY, share=1.0 if over else 0.0, max_gain=None,
                     evidence={"peak_memory_bytes": peak, "memory_limit_bytes": self.limit, "threshold": MEMORY_FRACTION},
                     reason=f"peak memory is {peak / self.limit:.0%} of the limit (> {MEMORY_FRACTION:.0%})"
                            + ("; the config does not fit" if over else ""))

    def compute(self) -> Waste:
        share = sum(self.shares.get(k, 0.0) for k in COMPUTE_STAGES)
        return Waste(cls=Bottleneck.COMPUTE, share=share, max_gain=None, evidence={"compute_share": round(share, 4)},
                     reason=f"the model's own work ({', '.join(COMPUTE_STAGES)}) is {share:.0%} of the step")


def _evidence(r: _Rules, memory_limit: int | None) -> dict[str, Any]:
    sig, st = r.sig, r.shares
    ev: dict[str, Any] = {
        "stage_shares": {k: round(v, 4) for k, v in st.items()},
        "data_share": round(st.get("data", 0.0), 4), "input_threshold": INPUT_SHARE,
        "h2d_share": round(st.get("h2d", 0.0), 4), "h2d_threshold": H2D_SHARE,
        "syncs_per_step": sig.get("syncs_per_step"), "sync_threshold": SYNCS_PER_STEP,
        "comm_share": sig.get("comm_share"), "comm_threshold": COMM_SHARE,
        "peak_memory_bytes": r.s.peak_memory_bytes, "memory_limit_bytes": memory_limit,
        "memory_threshold": MEMORY_FRACTION,
        "ops_per_step": sig.get("ops_per_step"), "mean_op_us": sig.get("mean_op_us"),
    }
    if r.device == "cuda":
        ev.update(gpu_busy=sig.get("gpu_busy"), gpu_busy_threshold=GPU_BUSY,
                  short_kernel_share=sig.get("short_kernel_share"),
                  pageable_copies_per_step=sig.get("pageable_copies_per_step"))
    else:
        ev.update(cpu_mean_op_us_threshold=CPU_MEAN_OP_US, cpu_ops_per_step_threshold=CPU_OPS_PER_STEP)
    return ev


# Rule order breaks ties between equal shares (and ranks the no-share sync rule on CPU).
_ORDER = [Bottleneck.MEMORY, Bottleneck.INPUT, Bottleneck.COMMUNICATION, Bottleneck.TRANSFER, Bottleneck.SYNC,
          Bottleneck.LAUNCH, Bottleneck.COMPUTE]


def _dominant(wastes: list[Waste]) -> tuple[Waste, float]:
    """The waste holding the largest share of the step, the model's own compute included (net of
    the launch overhead measured inside it); a config that does not fit is memory-bound first."""
    compute = wastes[-1]
    inside = sum(w.share for w in wastes if w.cls is Bottleneck.LAUNCH)
    own = max(0.0, compute.share - inside)
    if wastes[0].cls is Bottleneck.MEMORY and wastes[0].share >= 1:
        return wastes[0], own
    top = max(wastes[:-1], key=lambda w: w.share, default=None)  # ties: the rule order of `wastes`
    return (top if top is not None and top.share >= own else compute), own


def diagnose(summary: Summary, device: str, memory_limit: int | None = None, oom: bool = False,
             previous: Verdict | None = None) -> Verdict:
    """Classify one measurement summary; `previous` (the run's last verdict) settles
    shares within noise of their line."""
    r = _Rules(summary, device, memory_limit, previous)
    fired = [w for w in (r.memory(oom), r.input(), r.communication(), r.transfer(), r.sync(), r.launch()) if w]
    wastes = sorted(fired, key=lambda w: (w.cls is not Bottleneck.MEMORY, -w.share, _ORDER.index(w.cls)))
    wastes.append(r.compute())
    top, own = _dominant(wastes)
    slowest = max(r.shares, key=r.shares.get)
    if top.cls is not Bottleneck.COMPUTE:
        reason = top.reason
    else:
        beside = ", ".join(f"{w.cls.value} {w.share:.0%}" for w in wastes[:-1])
        reason = (f"the model's own work is {own:.0%} of the step, most of it in {slowest}; "
                  + (f"wastes beside it: {beside}" if beside else "no overhead rule fired"))
    return Verdict(bottleneck=top.cls, slowest_stage=slowest, evidence=_evidence(r, memory_limit), reason=reason,
                   wastes=wastes)
