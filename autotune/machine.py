"""What machine a measurement ran on: the facts a report shows and a comparison must match."""

from __future__ import annotations

import math
import os
import platform
import resource
from typing import Iterable

import torch

from .record import Limit, Machine, Summary, WorkerRef

__all__ = ["available_memory_bytes", "core_set", "cores", "cpu_isa", "cpu_name", "describe", "fingerprint",
           "fingerprint_id", "growth_limit", "loading_cpu_share", "open_files_limit", "saturating", "worker_limits",
           "worker_ref"]

FILES_PER_WORKER = 8  # pipes, a shared-memory handle and queues per DataLoader worker
OVERSUBSCRIBE = 2  # CPU-bound loader workers per core worth trying, at most
SATURATED = 1.5  # CPU-bound loader workers, over those that keep the cores busy, past which none are added
WORKER_MEMORY_SHARE = 0.5  # DataLoader workers may take at most this much of the available memory


def cores() -> int:
    """CPU cores this process may run on (its affinity, not the machine's total)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def core_set() -> list[int]:
    """The CPU cores this process may run on, by number."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_name() -> str:
    """The CPU model, e.g. "AMD EPYC 7B13" (bf16 speed depends on it: measure, never assume)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_isa() -> str:
    """The widest matrix/vector units the CPU reports: "amx", "avx512_bf16", "avx512", "avx2"
    or "" (another architecture, or unknown). A virtual machine's model name ("AMD EPYC") can
    stand for CPUs from AVX2-only ones, where bf16 is emulated, to ones with AVX512-BF16, so
    a figure measured on one is no truth for the other."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return ""
    return next((name for name, flag in (("amx", "amx_bf16"), ("avx512_bf16", "avx512_bf16"), ("avx512", "avx512f"),
                                         ("avx2", "avx2")) if flag in flags), "")


def describe(device: torch.device) -> Machine:
    return Machine(cores=cores(), torch=torch.__version__, cpu=cpu_name(),
                   gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                   python=platform.python_version())


def fingerprint(device: torch.device) -> dict[str, object]:
    """What makes two machines' measurements comparable: the CPU model, how many cores a
    process may use (their count, not their numbers: two workers pinned to cores 0 and 1 of
    one CPU compare), the GPU model and count, and the torch and CUDA versions."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"device": device.type, "cpu": cpu_name(), "cores": cores(), "gpu": gpu,
            "gpus": torch.cuda.device_count() if device.type == "cuda" else 0,
            "torch": torch.__version__, "cuda": torch.version.cuda if device.type == "cuda" else None}


def fingerprint_id(fp: dict[str, object]) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:10]


def worker_ref(device: torch.device) -> WorkerRef:
    """This process as the measurer of a trial."""
    import socket

    return WorkerRef(host=socket.gethostname(), pid=os.getpid(), machine=fingerprint_id(fingerprint(device)),
                     cores=core_set())


def available_memory_bytes() -> int | None:
    """Memory the host can still give (MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def open_files_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def growth_limit(key: str, summary: Summary) -> int:
    """The largest value a growing knob may take on this host, given what a trial used: for
    DataLoader workers, the least of `worker_limits`."""
    return min(worker_limits([summary]).values()) if key == "data.num_workers" else 2**31


def worker_limits(summaries: list[Summary]) -> dict[Limit, int]:
    """The most DataLoader workers each of this host's limits allows, given what `summaries` used:
    memory (each may hold the training process's peak RSS), open files, and `OVERSUBSCRIBE` times
    the workers that keep the cores busy (`cores / data_cpu_share`)."""
    out = {Limit.OPEN_FILES: open_files_limit() // FILES_PER_WORKER}
    avail = available_memory_bytes()
    rss = max((s.peak_rss_bytes for s in summaries if s.peak_rss_bytes), default=None)
    if avail and rss:
        out[Limit.MEMORY] = int(WORKER_MEMORY_SHARE * avail // rss)
    cpu = loading_cpu_share(summaries)
    if cpu:
        out[Limit.CORES] = math.ceil(OVERSUBSCRIBE * cores() / cpu)
    return {k: max(1, int(v)) for k, v in out.items()}


def saturating(key: str, top: int, *summaries: Summary) -> float | None:
    """How many workers keep the cores busy (`cores / data_cpu_share`), when `top` of them already
    exceed that by `SATURATED` and growing the range could only time-slice them; None when the
    range may grow."""
    if key != "data.num_workers":
        return None
    cpu = loading_cpu_share(summaries)
    if not cpu:
        return None
    busy = cores() / cpu
    return busy if top >= SATURATED * busy else None


def loading_cpu_share(summaries: Iterable[Summary]) -> float | None:
    """The largest CPU share of the data wait among `summaries` that loaded in the training
    process (None where none did)."""
    return max((s.signals.data_cpu_share for s in summaries if s.signals and s.signals.data_cpu_share), default=None)
