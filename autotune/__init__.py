"""autotune: measure a PyTorch training step, name its bottleneck with evidence, apply and
search the matching fix with Optuna, and keep only what measurably helps."""

from __future__ import annotations

from . import apply
from .config import TrainConfig, load_config, save_config
from .diagnose import Bottleneck, Verdict, diagnose
from .measure import Measurement, Protocol, measure
from .workload import Workload, load_workload

__all__ = [
    "apply", "Bottleneck", "Measurement", "Protocol", "TrainConfig", "Verdict", "Workload",
    "diagnose", "load_config", "load_workload", "measure", "save_config",
]
__version__ = "0.1.0"
