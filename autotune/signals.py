"""A short `torch.profiler` window: the signals the diagnosis reads, and peak tensor memory.

On CPU there is no allocator-stats API and RSS hides what checkpointing saves (glibc keeps
freed memory), so peak memory is the profiler's largest "Total Allocated" plus the tensors
that live across steps (parameters, optimizer state), which were allocated before it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

_COMM = re.compile(r"(all_?reduce|all_?gather|reduce_?scatter|broadcast|nccl|gloo|c10d::)", re.I)
_SYNC = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
_USER_RANGES = ("autotune::forward", "autotune::backward")


def persistent_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    seen, total = set(), 0
    tensors = list(model.parameters()) + list(model.buffers())
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


@contextlib.contextmanager
def quiet_stderr():
    """Silence file descriptor 2 (C-level writes too, e.g. Kineto's log lines) for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _ancestors(ev) -> list[str]:
    names, p = [], ev.cpu_parent
    while p is not None:
        names.append(p.name)
        p = p.cpu_parent
    return names


def collect(run_steps, steps: int, device: torch.device, trace_path: str | None = None) -> dict[str, Any]:
    """Run `run_steps(n)` under the profiler and return the signals, in per-step units."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    # Kineto and the CPU allocator print log lines to stderr at every start, stop and free
    # of a block allocated before; exceptions still propagate.
    with quiet_stderr(), profile(activities=activities, profile_memory=True) as prof:
        wall = run_steps(steps)
    # With a trace to keep, the temporary file sits beside it: os.replace cannot cross filesystems.
    where = os.path.dirname(os.path.abspath(trace_path)) if trace_path else None
    fd, tmp = tempfile.mkstemp(suffix=".json", dir=where, prefix=".trace." if where else "tmp")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp) as f:
            trace = json.load(f)
        if trace_path:
            os.replace(tmp, trace_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    peak_alloc = max(
        (e["args"].get("Total Allocated", 0) for e in trace.get("traceEvents", [])
         if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == (1 if device.type == "cuda" else 0)),
        default=0,
    )
    top_ops, syncs, comm_us = [], 0, 0.0
    kernels, pageable = [], 0
    for ev in prof.events():
        name = ev.name
        if name in _SYNC:
            # Only the user's own (`.item()` in the loss, ...): not autotune's (the copy of a
            # pageable batch in h2d, which is the transfer rule's; the clock's window edges),
            # and one per sync, not again for the runtime call under `.item()`.
            up = _ancestors(ev)
            if any(a in _USER_RANGES for a in up) and not any(a in _SYNC for a in up):
                syncs += 1
        if name.startswith("aten::") and (ev.cpu_parent is None or not ev.cpu_parent.name.startswith("aten::")):
            if "autotune::data" not in _ancestors(ev):  # ops of an in-process loader are input work
                top_ops.append(ev.cpu_time_total)
        if _COMM.search(name) and (ev.cpu_parent is None or not _COMM.search(ev.cpu_parent.name)):
            comm_us += ev.cpu_time_total
        for k in getattr(ev, "kernels", []) or []:
            kernels.append(k.duration)
            if "Pageable" in k.name:
                pageable += 1
    n = max(1, steps)
    signals = {
        "profiled_steps": steps,
        "profiled_wall_s": wall,
        "ops_per_step": len(top_ops) / n,
        "mean_op_us": (sum(top_ops) / len(top_ops)) if top_ops else 0.0,
        "syncs_per_step": syncs / n,
        "comm_share": min(1.0, comm_us / 1e6 / wall) if wall > 0 else 0.0,
        "peak_profiled_alloc_bytes": int(peak_alloc),
    }
    if device.type == "cuda":
        signals["gpu_busy"] = min(1.0, sum(kernels) / 1e6 / wall) if wall > 0 else 0.0
        signals["short_kernel_share"] = (sum(1 for d in kernels if d < 10) / len(kernels)) if kernels else 0.0
        signals["pageable_copies_per_step"] = pageable / n
    return signals
