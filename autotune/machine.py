"""What machine a measurement ran on: the facts a report shows and a comparison must match."""

from __future__ import annotations

import os
import platform

import torch

from .record import Machine

__all__ = ["cores", "cpu_name", "describe"]


def cores() -> int:
    """CPU cores this process may run on (its affinity, not the machine's total)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


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


def describe(device: torch.device) -> Machine:
    return Machine(cores=cores(), torch=torch.__version__, cpu=cpu_name(),
                   gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                   python=platform.python_version())
