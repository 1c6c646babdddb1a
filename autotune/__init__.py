"""autotune: measure a PyTorch training step, name its bottleneck with evidence, apply and
search the matching fix with Optuna, and keep only what measurably helps."""

from __future__ import annotations

from . import apply
from .config import TrainConfig, load_config, save_config
from .diagnose import diagnose
from .measure import Measurement, Protocol, measure
from .record import (
    Bottleneck, FailureKind, Recommendation, Report, Step, Summary, Trial, TrialState, Verdict, report_schema,
)
from .version import __version__
from .workload import Workload, load_workload

__all__ = [
    "apply", "Bottleneck", "FailureKind", "Measurement", "Protocol", "Recommendation", "Report", "Step", "Summary",
    "TrainConfig", "Trial", "TrialState", "Verdict", "Workload", "__version__", "diagnose", "load_config",
    "load_workload", "measure", "report_schema", "save_config",
]
