"""The typed run record: every value that crosses a boundary between autotune's stages.

One measurement is a `Summary`; a diagnosis is a `Verdict`; one recipe's round is a
`Step` holding its `Trial`s; the whole run is a `Report`, which is exactly what
`report.json` stores. The worker pipe, Optuna's user attributes, the agent, the
reporters and `autotune report` all pass these models, never loose dicts, so a field is
written in one place and its JSON schema ships with the package (`report_schema()`).

Configs are flat dotted keys throughout (`"data.num_workers": 4`), as in `changes` and `tuned.yaml`.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .policy import DEFAULT

FlatConfig = dict[str, Any]
"""A `TrainConfig` as `{"section.key": value}` for every key."""

Changes = dict[str, list[Any]]
"""`{"section.key": [old, new]}` for the keys that changed."""


class Bottleneck(str, Enum):
    """What limits a training step (the JSON names are part of the contract)."""

    INPUT = "input"
    TRANSFER = "transfer"
    SYNC = "sync"
    LAUNCH = "launch"
    COMPUTE = "compute"
    MEMORY = "memory"
    COMMUNICATION = "communication"


class TrialState(str, Enum):
    """How a trial ended: measured and usable, measured but over a limit, stopped after a
    window far slower than the current config, or not measured."""

    OK = "ok"
    INFEASIBLE = "infeasible"
    SLOW = "slow"
    FAILED = "failed"


class FailureKind(str, Enum):
    """Why a measurement could not finish."""

    OOM = "oom"
    CRASH = "crash"
    TIMEOUT = "timeout"
    KILLED = "killed"  # SIGKILL without a sign of the kernel's OOM killer
    USER = "user"  # bad input (a config that does not apply, a dataset too small, ...)
    USER_CODE = "user_code"  # the workload's own code raised


class Record(BaseModel):
    """Base of every record: unknown fields are an error, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid")


class StepTime(Record):
    median: float | None = Field(description="Median per-step time over every measured step (s).")
    p90: float | None = Field(description="90th percentile per-step time (s).")
    mean: float | None = Field(description="Mean step time: the sum of the stage means (s).")


class StageTime(Record):
    s: float = Field(description="Mean seconds per step spent in this stage.")
    share: float = Field(description="Fraction of the step.")


class Signals(Record):
    """What the profiled steps showed, per step."""

    profiled_steps: int = 0
    profiled_wall_s: float = 0.0
    ops_per_step: float | None = None
    mean_op_us: float | None = None
    syncs_per_step: float | None = None
    comm_share: float | None = None
    peak_profiled_alloc_bytes: int | None = None
    gpu_busy: float | None = None
    short_kernel_share: float | None = None
    pageable_copies_per_step: float | None = None
    data_cpu_share: float | None = Field(None, description="The loading thread's CPU time over its wait for "
                                         "batches in the profiled steps, when batches load in the training process "
                                         "(no loader workers): near 1, loading is CPU work (decoding); near 0, it "
                                         "waits (storage, network).")
    world_size: int | None = Field(None, description="DDP ranks (set only for a distributed step).")
    allreduce_bytes_per_step: int | None = Field(None, description="Gradient bytes each rank all-reduces per step.")
    backward_synced_s: float | None = Field(None, description="Rank 0's median backward with DDP's all-reduce "
                                            "(reference passes after the windows).")
    backward_local_s: float | None = Field(None, description="Rank 0's median backward under no_sync() (no all-reduce).")


class Summary(Record):
    """Everything measured of one config under the run's protocol."""

    config: FlatConfig
    step_time_s: StepTime
    samples_per_s: float = Field(description="Total samples over total wall time of the measured windows.")
    windows_samples_per_s: list[float]
    window_cv: float = Field(description="Coefficient of variation of the windows' throughput.")
    stages: dict[str, StageTime]
    window_stage_shares: list[dict[str, float]] = Field(
        default_factory=list, description="Each window's stage shares: the spread a diagnosis weighs a share against.")
    peak_memory_bytes: int | None = None
    peak_rss_bytes: int | None = None
    one_time: dict[str, float] = Field(default_factory=dict, description=(
        "setup_s, first_step_s, loader_first_batch_s, epoch_start_s (the last window's), worker_start_s (persistent "
        "workers' one start: charged to no window)."))
    signals: Signals = Field(default_factory=Signals)
    measured_steps: int = 0
    first_losses: list[float] = Field(default_factory=list)
    wall_s: float | None = Field(None, description="Wall time of the whole measurement, start-up included (s).")
    world_size: int = Field(1, description="Ranks that ran the step (DDP); throughput counts the samples of all.")
    rank_stages: list[dict[str, StageTime]] = Field(
        default_factory=list, description="Stage times of each rank (index = rank), communication included; "
                                          "empty for one process.")


class Waste(Record):
    """One class whose rule fired: what share of the step it costs and the most a fix could gain."""

    model_config = ConfigDict(extra="forbid", serialize_by_alias=True, validate_by_name=True, validate_by_alias=True)

    cls: Bottleneck = Field(alias="class")
    share: float = Field(description="Fraction of the step this waste costs (memory: 1 when the config does not fit).")
    max_gain: float | None = Field(description="Amdahl bound: 1 / (1 - share); null where no bound applies "
                                               "(memory is a constraint, compute is the model's own work).")
    reason: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)


class Verdict(Record):
    """A diagnosis: the class holding the largest share of the step, the slowest stage, every waste ranked, and the numbers."""

    bottleneck: Bottleneck
    slowest_stage: str
    evidence: dict[str, Any] = Field(default_factory=dict)
    reason: str = ""
    wastes: list[Waste] = Field(default_factory=list, description="Every class whose rule fires, ranked; "
                                "compute (the model's own work) last.")

    def waste(self, cls: Bottleneck) -> Waste | None:
        return next((w for w in self.wastes if w.cls is cls), None)


class Ratio(Record):
    """B's throughput over A's from windows taken in turns, with its 95% interval."""

    ratio: float | None
    low: float | None
    high: float | None
    pairs: int = 0

    @field_validator("ratio", "low", "high", mode="before")
    @classmethod
    def _finite_or_none(cls, v: Any) -> Any:
        """No pairs (or an infinite interval from one pair) is "not measured", stored as null."""
        return None if isinstance(v, float) and not math.isfinite(v) else v

    @property
    def measured(self) -> bool:
        return self.ratio is not None and self.low is not None and self.high is not None


class Comparison(Ratio):
    """A stored interleaved comparison: the windows themselves, or why it failed."""

    a: list[float] = Field(default_factory=list)
    b: list[float] = Field(default_factory=list)
    failed: str | None = None

    def ratio_only(self) -> Ratio:
        return Ratio(ratio=self.ratio, low=self.low, high=self.high, pairs=self.pairs)


BAND_CAP = 1.5  # a single reading's widest band from the run's spread (noisier: the A/A says so)


class Noise(Ratio):
    """The baseline against itself (A/A): what "no change" measures as here.

    Two A/As from fresh pairs of sessions, pooled. When the pooled one is implausible
    (identical configs measured apart beyond their own interval, or by more than twice the
    least gain), a third is measured and the two nearest 1 are pooled; `readings` holds
    every A/A measured (one alone: the second failed)."""

    margin: float = Field(description="The A/A's distance from 1, never under 1 + min_gain: the least gain a waste "
                          "must promise, or a search reading show, for a recipe to be worth a search")
    min_gain: float = Field(description="The least gain kept: a change is kept when the noise model gives "
                            "P(gain > 1 + min_gain) >= 1 - alpha over its side-by-side looks (docs/policy.md)")
    alpha: float = Field(DEFAULT.alpha, description="A change is kept when P(gain > 1 + min_gain) >= 1 - alpha")
    floor: float = Field(DEFAULT.floor, description="A change is dropped once that chance falls below floor")
    max_looks: int = Field(DEFAULT.max_looks, description="Most side-by-side looks at one candidate")
    readings: list[Ratio] = Field(default_factory=list)
    band: float | None = Field(None, description="The factor within which a single search reading was taken as no "
                               "different from another config's (or its pooled estimate) when the run ended: the "
                               "spread of the run's unpaired readings, never below the A/A's or the windows' width")
    band_dof: int = Field(0, description="The readings beyond each config's first that the band's spread pools "
                          "(0: the A/A's width alone)")

    def too_noisy(self) -> bool:
        """Whether the band was wider than `BAND_CAP`, which only the A/As can make it (their width, or
        their ratio through the margin): something else used the machine while the baseline was
        re-measured. An unbounded band is the noisiest of all."""
        return self.band is not None and self.band > BAND_CAP


class WorkerRef(Record):
    """Who measured a trial: the process, its host, and its machine's fingerprint id
    (`autotune.machine.fingerprint`); only trials of one fingerprint are compared."""

    host: str
    pid: int
    machine: str
    cores: list[int] = Field(default_factory=list)


class Trial(Record):
    """One configuration tried in a recipe's search."""

    number: int
    changes: Changes = Field(default_factory=dict)
    samples_per_s: float | None = Field(None, description="Its throughput; for a `slow` trial, over the windows "
                                       "it ran before it was stopped.")
    state: TrialState
    reason: str | None = None
    peak_memory_bytes: int | None = None
    config: FlatConfig | None = None
    worker: WorkerRef | None = None
    reused_from: str | None = Field(None, description="Where this config's reading was taken before in the run "
                                    "(`<study>#<trial>`): not measured again, and not counted in `budget.trials_used`.")


class Brief(Record):
    """The few figures of a summary a step's recommendation is computed from."""

    samples_per_s: float | None
    peak_memory_bytes: int | None
    step_time_s: float | None
    one_time_s: float

    @classmethod
    def of(cls, s: Summary) -> Brief:
        return cls(samples_per_s=s.samples_per_s, peak_memory_bytes=s.peak_memory_bytes, step_time_s=s.step_time_s.mean,
                   one_time_s=s.one_time.get("setup_s", 0.0) + s.one_time.get("first_step_s", 0.0))


class Step(Record):
    """One recipe's round: its trials, the candidate it produced, and the decision."""

    round: int
    recipe: str
    bottleneck: Bottleneck = Field(description="The class the recipe was chosen for.")
    expected_gain: float | None = Field(None, description="The prior that ranked this recipe (null: the config "
                                        "did not fit the memory limit); the measurement decides.")
    grown: list[str] = Field(default_factory=list, description="Ranges grown past their top, and why.")
    trials: list[Trial] = Field(default_factory=list)
    accepted: bool = False
    changes: Changes = Field(default_factory=dict)
    speedup: Ratio | None = None
    before: Brief
    after: Brief | None = None
    after_config: FlatConfig | None = None
    reason: str | None = None


class Recommendation(Record):
    recipe: str
    changes: Changes
    speedup: float | None
    ci: list[float | None] = Field(description="[low, high] of the speedup's 95% interval.")
    memory_delta_bytes: int | None = None
    accepted: bool
    tried: bool = Field(True, description="False where the round measured no config (the time budget ran out "
                        "first): the recipe is untested here, not rejected.")
    reason: str | None = None
    one_time_s: float | None = None
    payoff_steps: int | None = None
    snippet: str = ""


class Machine(Record):
    cores: int
    torch: str
    cpu: str
    gpu: str | None = None
    python: str
    lowp_matmul: dict[str, float] = Field(default_factory=dict, description=(
        "Each lower precision's matrix-product throughput over fp32's on this CPU (a 512x512 product, best of "
        "up to 40; empty: not measured, as on CUDA). amp is searched for speed only with a dtype at least 1.5x."))
    batch_handoff_s: float | None = Field(None, description=(
        "The least time the training process took to receive one of the workload's batches from a loader worker "
        "(s; null: not measured). Loader workers are not searched where the step loads a batch in less."))


class ProtocolRecord(Record):
    warmup_steps: int
    steps: int
    windows: int
    seed: int
    profile_steps: int
    window_s: float | None = Field(None, description="Least seconds per window, steps raised to it (null: --steps fixed).")
    window_rule: str
    throughput: str


class StudyRef(Record):
    name: str
    storage: str | None = None
    fingerprint: str | None = Field(None, description="Id of what the measurements depend on (target, protocol, "
                                    "device, cores, memory limit, recipes, versions); a resume needs the same.")
    note: str | None = Field(None, description="Why this run uses another study than the one asked for.")


class Budget(Record):
    trials_used: int = Field(description="Configs measured by the search rounds (a reading reused from earlier in "
                                         "the run is not counted).")
    trials_run_now: int
    trials_limit: int
    trials_skipped_for_budget: int = Field(0, description="Trials not started: they could not finish inside --budget.")
    wall_s: float
    budget_s: float | None = None


class Limit(str, Enum):
    """What stopped a lever short of removing its waste (the JSON names are part of the contract)."""

    OPEN_FILES = "open_files"  # the host's open-file limit, a few files per loader worker
    MEMORY = "memory"  # the host's available memory, each worker as large as the training process
    CORES = "cores"  # loading is CPU work and the workers already fill the cores
    NO_FASTER = "no_faster"  # more of the knob was measured and read no faster
    FAILED = "failed"  # more of the knob was tried and could not run
    HANDOFF = "handoff"  # receiving a batch from a worker costs most of what loading it in the step does
    SEARCH = "search"  # the round's trials or its range's growth ran out before more was measured


class Leftover(Record):
    """The waste a run stopped with: why its lever stopped where it did, and what a person can do."""

    waste: Bottleneck
    reason: str = Field(description="Why no recipe is left for it: the start of `stop_reason`.")
    limit: Limit | None = Field(None, description="What stopped its lever (null: none was searched on it).")
    why: str = Field("", description="That limit in words, with the measured numbers it was read from.")
    advice: str = Field("", description="What a person can do, and where: \"beyond autotune's knobs: ...\".")
    evidence: dict[str, Any] = Field(default_factory=dict)


class Report(Record):
    """A whole tuning run; `report.json` is this model's JSON."""

    autotune_version: str
    workload: str
    target: str | None = None
    batch_size: int | None = Field(None, description="The workload's global batch per optimizer step (never changed).")
    device: str
    memory_limit_bytes: int | None = None
    machine: Machine
    protocol: ProtocolRecord
    study: StudyRef
    baseline: Summary | None = None
    initial_diagnosis: Verdict | None = None
    noise: Noise | None = None
    steps: list[Step] = Field(default_factory=list)
    final: Summary | None = None
    final_config: FlatConfig | None = None
    diagnosis: Verdict | None = None
    recommendations: list[Recommendation] = Field(default_factory=list)
    speedup: Ratio | None = Field(None, description="The final config against the baseline, side by side in one "
                                  "fresh pair of sessions; its interval holds the spread between sessions (the A/As' "
                                  "and the run's other looks), not only its own pairs'")
    stop_reason: str | None = None
    leftover: Leftover | None = Field(None, description="A waste left at the stop: why its lever stopped where it "
                                      "did, and what a person can do (`stop_reason` holds the same words).")
    budget: Budget | None = None
    complete: bool = Field(False, description="False: the run was stopped (signal, error) and this report is "
                           "partial; stop_reason says why. Rerun the same command to resume.")

    def missing(self) -> list[str]:
        """What an interrupted run did not get to record, in words."""
        checks = [(self.baseline, "the baseline measurement"), (self.final, "the final measurement"),
                  (self.speedup, "the final-versus-baseline speedup"),
                  (self.diagnosis, "the diagnosis of the final config"),
                  (self.steps, "any recipe step (none was tried)"), (self.stop_reason, "the reason the search stopped")]
        return [words for value, words in checks if not value]


def report_schema() -> dict[str, Any]:
    """The JSON schema `report.json` follows."""
    return Report.model_json_schema()
