"""The planted-bottleneck examples the suite runs, each with its stated grid, and the held-out set.

A case names the example file, the function and arguments that build its workload, the
bottleneck planted in it, the grid that is measured exhaustively for the oracle, and the
memory limit it runs under. Grids are small on purpose (the whole suite must finish in
30 minutes on two cores) and contain the default config; a compiled config costs 10-15 s
per compilation, so grids hold compile where the case says why. The rule of thumb is the
same for every case. `HELDOUT` (`--set heldout`) holds workloads of other shapes, in
`benchmarks/heldout/`, scored apart and never used to tune a rule.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from autotune import probe
from autotune.config import TrainConfig
from autotune.errors import ConfigError, UserError
from autotune.search import normalized
from autotune.workload import Workload, load_module_from_file

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HELDOUT_DIR = Path(__file__).resolve().parent / "heldout"
SETS = ("bundled", "heldout", "all")  # `--set`: the bundled examples, the held-out workloads, or both
MiB = 2**20

# Every knob of every recipe that applies on a CPU, at a few values each, so that the full
# product is tens to a hundred-odd configs (a quarter of it is a real trial budget) and a
# grid measures in minutes on two cores. What a grid holds at its default is named in the
# case's `held`, with why. The fp32 grids hold every compile mode the recipe tries on a CPU:
# `max-autotune-no-cudagraphs` is not the default mode there (inductor's C++ GEMM templates
# lower batched matmuls such as attention's; a model's weight matmuls only under freezing,
# so in training it is the default mode elsewhere); `reduce-overhead` is (CUDA graphs). The
# grids with bf16 hold compile at "default": each bf16 compilation costs tens of seconds.
LOADER = {"data.num_workers": [0, 1, 2, 4, 8, 16], "data.prefetch_factor": [2, 4],
          "data.persistent_workers": [False, True], "backend.num_threads": [None, 1]}
INPUT_GRID = {**LOADER, "optimizer.impl": ["default", "foreach"]}
DECODE_GRID = {**LOADER, "data.num_workers": [0, 1, 2, 3, 4]}  # CPU-bound decoding: workers past the cores only cost
COMPUTE_GRID = {"optimizer.impl": ["default", "foreach", "fused"], "precision.amp": ["none", "bf16"],
                "compile.mode": ["none", "default"], "backend.num_threads": [None, 1]}
MEMORY_GRID = {"memory.micro_batch_size": [None, 512, 256, 128, 64], "memory.activation_checkpointing": [False, True]}
FP32_GRID = {"optimizer.impl": ["default", "foreach", "fused"],
             "compile.mode": ["none", "default", "max-autotune-no-cudagraphs"],
             "backend.num_threads": [None, 1]}
BF16_COST = ("bf16 where this CPU emulates it (on an AMD EPYC: in compute_bound's grid every bf16 config was 2-10x "
             "slower and took 15-36 s to measure; in memory_bound's, 130-180 s each); the grid holds it where the "
             "probe finds units for it")
CONV_GRID = {"data.num_workers": [0, 1, 2], "backend.num_threads": [None, 1], "layout.channels_last": [False, True],
             "optimizer.impl": ["default", "foreach"]}
HELD_MODES = ("compile's max-autotune-no-cudagraphs mode (the grid has compile's default mode only: with bf16 in the "
              "grid each extra compiled config costs tens of seconds; autotune's trials of it count as its own)")
NO_LIMIT = ("micro-batch and activation checkpointing (memory recipes: with no memory limit they only cost speed, "
            "and the agent tries them only on a memory verdict)")
SMALL_GRID_TEST = {"optimizer.impl": ["default", "foreach"]}


@dataclass(frozen=True)
class Case:
    """One example under test.

    Attributes:
        name: The example's module name in `examples/` (also the case's name).
        planted: The bottleneck class planted in it (a `Bottleneck` value); "" for a
            realistic example, where nothing was planted.
        fn: The function in the example that builds the workload.
        kwargs: Its arguments.
        grid: Dotted config key -> values; every combination is measured (after
            normalisation, duplicates collapse).
        memory_limit: Peak memory allowed, in bytes; configs over it count as 0.
        isolate: Measure each config in its own process. Needed where memory is judged:
            in one process the profiler's "Total Allocated" keeps tensors that an earlier
            profiled run allocated and freed after it stopped, so the measured peak creeps up
            (0.26 MiB per measurement on memory_bound, against an 8 MiB limit).
        quick: Whether this is a --quick case (selects the table a worker loads it from).
        note: Why this workload and grid, in one line.
        held: The applicable recipes' knobs the grid holds at their default, and why.
        rule_floor: Whether autotune is held to at least the rule of thumb's throughput here
            (the I/O example, where the rule's many workers are right).
        lowp: Add `precision.amp` at every lower precision this machine multiplies fast in
            (`autotune.probe`) to the grid (`for_machine`): where bf16 has units it is a knob
            a good engineer tries; where it is emulated it is 7-20x slower and a grid of it
            would cost tens of minutes to say so.
        heldout: A held-out workload (`benchmarks/heldout/`): scored apart from the bundled
            examples, and no decision rule is tuned on it.
    """

    name: str
    planted: str
    fn: str = "small"
    kwargs: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    memory_limit: int | None = None
    isolate: bool = False
    quick: bool = False
    note: str = ""
    held: str = ""
    rule_floor: bool = False
    lowp: bool = False
    heldout: bool = False

    def for_machine(self, fast: list[str]) -> Case:
        """This case with its grid as measured on a machine whose fast lower precisions are
        `fast`: with `lowp`, they join the grid (none where they are emulated)."""
        if not self.lowp or not fast or "precision.amp" in self.grid:
            return self
        return replace(self, grid={**self.grid, "precision.amp": ["none", *sorted(fast)]})

    @property
    def set(self) -> str:
        return "heldout" if self.heldout else "bundled"

    @property
    def path(self) -> Path:
        return (HELDOUT_DIR if self.heldout else EXAMPLES) / f"{self.name}.py"

    @property
    def target(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{'benchmarks/heldout' if self.heldout else 'examples'}/{self.name}.py:{self.fn}({args})"

    @property
    def spec(self) -> str:
        """A target string a worker process can load (see `__getattr__` below): this file by
        its path, so the worker needs no `benchmarks` on its `sys.path`."""
        return f"{Path(__file__).resolve()}:{'quick_' if self.quick else ''}{self.name}"

    def workload(self) -> Workload:
        if not self.path.is_file():
            raise UserError(f"example {str(self.path)!r} is missing; run the benchmark from a source checkout.")
        module = load_module_from_file(self.path, str(self.path))
        wl = getattr(module, self.fn)(**self.kwargs)
        if not isinstance(wl, Workload):
            raise UserError(f"{self.target} returned {type(wl).__name__}, not an autotune.Workload.")
        return wl

    def configs(self) -> list[TrainConfig]:
        """Every distinct config of the grid, the default first."""
        keys = list(self.grid)
        seen: dict[tuple, TrainConfig] = {}
        default = TrainConfig()
        seen[tuple(sorted(default.flat().items(), key=lambda kv: kv[0]))] = default
        for values in itertools.product(*(self.grid[k] for k in keys)):
            try:
                cfg = normalized(default, dict(zip(keys, values)))
            except ConfigError:
                continue
            seen.setdefault(tuple(sorted(cfg.flat().items(), key=lambda kv: kv[0])), cfg)
        return list(seen.values())

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "set": self.set, "target": self.target, "planted": self.planted or None,
                "grid": self.grid, "grid_size": len(self.configs()), "memory_limit_bytes": self.memory_limit,
                "note": self.note, "held": self.held}


HELD_LOADER = "data-loader workers (in-memory tensors: no data to wait for; the grid keeps the loader recipe's thread knob)"
CASES: tuple[Case, ...] = (
    Case("input_bound", "input", grid=INPUT_GRID, rule_floor=True,
         note="2 ms I/O latency per sample: workers past the core count keep helping",
         held=f"bf16 and compile (the step waits on I/O; bf16 is 7-20x slower on this CPU); {NO_LIMIT}"),
    Case("decode_bound", "input", grid=DECODE_GRID,
         note="2 ms of pure-Python decoding per sample: workers help only up to the cores",
         held="the optimizer implementation, bf16 and compile (the step waits on decoding; bf16 is 7-20x slower on "
              f"this CPU); workers stop at 4 (2 x cores: decoding is CPU-bound, and a config with 8 or 16 workers took "
              f"30-90 s to measure here); {NO_LIMIT}"),
    Case("compute_bound", "compute", fn="workload", kwargs={"width": 1024, "batch_size": 16}, grid=COMPUTE_GRID,
         note="wide MLP, in-memory data; batch 16 keeps bf16 trials affordable where bf16 is emulated (20x slower)",
         held=f"{HELD_LOADER}; {HELD_MODES}; {NO_LIMIT}"),
    Case("overhead_bound", "launch", grid=COMPUTE_GRID,
         note="32 tiny layers with Adam: dispatch overhead; foreach helps the many small parameters",
         held=f"{HELD_LOADER}; {HELD_MODES}; {NO_LIMIT}"),
    Case("memory_bound", "memory", fn="workload", kwargs={"width": 128, "depth": 8, "batch_size": 1024},
         grid=MEMORY_GRID, memory_limit=8 * MiB, isolate=True, lowp=True,
         note="residual MLP whose activations dominate (batch 1024, width 128): about 14 MiB by default, "
              "8 MiB allowed; micro-batches or checkpointing must make it fit",
         held=f"{BF16_COST}, the data loader (in-memory tensors), compile (a fresh process per measurement compiles "
              "cold: 10-15 s each) and the optimizer implementation (each isolated measurement costs 20-50 s here)"),
    Case("sync_bound", "sync", grid=FP32_GRID, lowp=True,
         note="an .item() every step: no recipe fixes user code, autotune reports it; the grid shows what knobs give",
         held=f"{BF16_COST}; {HELD_LOADER}; {NO_LIMIT}"),
    Case("gpt", "", fn="small", grid=FP32_GRID, lowp=True,
         note="realistic: a nanoGPT-style decoder (2 layers, 64 wide, context 32) with AdamW on token windows",
         held=f"{BF16_COST}; {HELD_LOADER}; {NO_LIMIT}"),
    Case("transformer_encoder", "", fn="small", grid=FP32_GRID, lowp=True,
         note="realistic: nn.TransformerEncoder classifier (2 layers, 64 wide) on padded variable-length sequences",
         held=f"{BF16_COST}; {HELD_LOADER}; {NO_LIMIT}"),
    Case("resnet_jpeg", "", fn="small", grid=CONV_GRID, lowp=True,
         note="realistic: ResNet-18 layout at width 16 on 32x32 crops of JPEG bytes decoded in __getitem__ (PIL)",
         held="bf16 where this CPU emulates it (16x slower on an AMD EPYC: 3.3 s a step at the default size; the grid "
              "holds it where the probe finds units for it) and compile (its first compilation took minutes on an "
              f"AMD EPYC); prefetch 2, no persistent workers, at most 2 workers (the cores); {NO_LIMIT}"),
)

# --quick: tiny workloads and two- to four-config grids, a smoke test of the whole pipeline.
_QUICK_CASES: tuple[Case, ...] = (
    Case("input_bound", "input", fn="workload", kwargs={"n": 256, "batch_size": 8}, grid={"data.num_workers": [0, 2]}),
    Case("decode_bound", "input", fn="workload", kwargs={"n": 256, "batch_size": 8}, grid={"data.num_workers": [0, 2]}),
    Case("compute_bound", "compute", fn="workload", kwargs={"width": 128, "batch_size": 32},
         grid={"optimizer.impl": ["default", "foreach"]}),
    Case("overhead_bound", "launch", fn="workload", kwargs={"depth": 8}, grid={"optimizer.impl": ["default", "foreach"]}),
    Case("memory_bound", "memory", fn="workload", kwargs={"width": 64, "depth": 4, "batch_size": 256},
         grid={"memory.micro_batch_size": [None, 64], "memory.activation_checkpointing": [False, True]},
         memory_limit=int(0.9 * MiB), isolate=True),
    Case("sync_bound", "sync", fn="workload", kwargs={"batch_size": 16}, grid={"optimizer.impl": ["default", "foreach"]}),
)

QUICK_CASES = tuple(Case(**{**c.__dict__, "quick": True}) for c in _QUICK_CASES)

# Held-out workloads (`benchmarks/heldout/`): shapes the bundled examples do not have, written
# and their grids measured before any later change to autotune's decisions, scored apart, and
# never used to tune a rule. Each grid is the applicable knobs that can matter at two or three
# values, 6-8 configs with the default among them, each read in two sessions (`grids.SESSIONS`).
# They were 12 configs each; on the shared two-core machine (load average 3.5-4 from other jobs)
# a reading of a two-thread config took 45-60 s, so the 120 readings would have taken about
# an hour: the knob values each step's profile shows cannot matter were dropped.
HELD_COMPILE = "compile (every session compiles each compiled config anew: 10-15 s a config on these CPUs)"
HELDOUT: tuple[Case, ...] = (
    Case("kws", "", fn="workload", heldout=True, lowp=True,
         grid={"data.num_workers": [0, 2], "backend.num_threads": [None, 1], "layout.channels_last": [False, True]},
         note="held out: keyword spotting, a log-mel spectrogram (torch.stft) with noise mixing and SpecAugment in "
              "__getitem__, a small VGG-style CNN, Adam",
         held=f"the optimizer implementation (Adam over 19k parameters), {HELD_COMPILE}; prefetch 2, no persistent "
              f"workers, 0 or 2 workers (the cores: the features are CPU work); {NO_LIMIT}"),
    Case("char_lstm", "", fn="workload", heldout=True,
         grid={"optimizer.impl": ["default", "foreach", "fused"], "backend.num_threads": [None, 1]},
         note="held out: a 2-layer character LSTM on variable-length lines padded in a collate_fn, Adam",
         held=f"the data loader (encoding a line and padding a batch: 0.4% of the step), compile (every batch has "
              f"another length: recompiles or dynamic shapes), bf16 (the LSTM kernel); {NO_LIMIT}"),
    Case("ctr", "", fn="workload", heldout=True,
         grid={"optimizer.impl": ["default", "foreach", "fused"], "backend.num_threads": [None, 1]},
         note="held out: DLRM-style click-through model on dict batches, 26 embedding tables (300k rows, dense "
              "gradients), Adam",
         held=f"the data loader (collating dict batches: 2-8% of the step), {HELD_COMPILE}, bf16 (embedding lookups "
              f"and small MLPs); {NO_LIMIT}"),
    Case("vit_small", "", fn="workload", heldout=True, lowp=True,
         grid={"optimizer.impl": ["default", "fused"], "compile.mode": ["none", "default"],
               "backend.num_threads": [None, 1]},
         note="held out: a 3-block ViT on 32x32 images (4x4 patches, SDPA attention), AdamW with decay groups",
         held=f"the data loader (crop and flip of in-memory images: 7% of the step), channels_last (one "
              f"patch-embedding conv), the foreach optimizer (between the default and fused), compile's other modes; "
              f"{NO_LIMIT}"),
    Case("segnet", "", fn="workload", heldout=True, lowp=True,
         grid={"data.num_workers": [0, 2], "backend.num_threads": [None, 1], "layout.channels_last": [False, True]},
         note="held out: a small U-Net with cross-entropy + Dice, image and mask cropped, flipped and rotated "
              "together in __getitem__, Adam",
         held=f"the optimizer implementation, {HELD_COMPILE}; prefetch 2, no persistent workers; {NO_LIMIT}"),
)

# --quick --set heldout: the held-out workloads at tiny sizes with two-config grids.
_QUICK_HELDOUT: tuple[Case, ...] = (
    Case("kws", "", fn="workload", kwargs={"n": 64, "width": 4, "batch_size": 8}, heldout=True,
         grid={"backend.num_threads": [None, 1]}),
    Case("char_lstm", "", fn="workload", kwargs={"n": 64, "max_len": 32, "hidden": 16, "batch_size": 8},
         heldout=True, grid={"optimizer.impl": ["default", "foreach"]}),
    Case("ctr", "", fn="workload", kwargs={"n": 256, "scale": 0.01, "batch_size": 32}, heldout=True,
         grid={"optimizer.impl": ["default", "foreach"]}),
    Case("vit_small", "", fn="workload", kwargs={"n": 64, "dim": 32, "depth": 1, "batch_size": 8}, heldout=True,
         grid={"optimizer.impl": ["default", "foreach"]}),
    Case("segnet", "", fn="workload", kwargs={"n": 32, "width": 4, "crop": 16, "batch_size": 4}, heldout=True,
         grid={"backend.num_threads": [None, 1]}),
)
QUICK_HELDOUT = tuple(Case(**{**c.__dict__, "quick": True}) for c in _QUICK_HELDOUT)


def __getattr__(name: str):
    """`benchmarks/cases.py:memory_bound` (or `:quick_memory_bound`, `:kws`) as a workload
    target: the case's workload function, so that a worker process can build it."""
    quick = name.startswith("quick_")
    for c in (QUICK_CASES + QUICK_HELDOUT) if quick else (CASES + HELDOUT):
        if c.name == name.removeprefix("quick_"):
            return c.workload
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def of_set(which: str, quick: bool = False) -> tuple[Case, ...]:
    """The cases of `--set` `which` (`SETS`): bundled, heldout, or all (bundled first)."""
    bundled, heldout = (QUICK_CASES, QUICK_HELDOUT) if quick else (CASES, HELDOUT)
    sets = {"bundled": bundled, "heldout": heldout, "all": bundled + heldout}
    if which not in sets:
        raise UserError(f"--set {which!r}: unknown set; choose one of {', '.join(SETS)}.")
    return sets[which]


@dataclass(frozen=True)
class RuleOfThumb:
    """The settings common tuning guides give for every training job, applied unmeasured.

    Data loading (PyTorch Performance Tuning Guide; Lightning's and Hugging Face's speed-up
    guides): many workers, deeper prefetch, persistent workers, pinned memory (CUDA only).
    The math: `torch.compile` in its default mode, and mixed precision where the guides add
    it: on GPUs (bf16, or fp16 without bf16 support) and on CPUs with native bf16 (AMX or
    AVX512-BF16; elsewhere bf16 is emulated and the CPU guides do not recommend it).
    """

    num_workers: int = 16
    prefetch_factor: int = 4
    persistent_workers: bool = True
    pin_memory: bool = True
    amp: bool = True
    compile_mode: str | None = "default"

    def config(self, device: torch.device) -> tuple[TrainConfig, list[str]]:
        """The config on `device`, and what had to be dropped there, with why."""
        notes = []
        changes: dict[str, Any] = {"data.num_workers": self.num_workers, "data.prefetch_factor": self.prefetch_factor,
                                   "data.persistent_workers": self.persistent_workers}
        if self.pin_memory:
            if device.type == "cuda":
                changes["data.pin_memory"] = True
            else:
                notes.append("pin_memory=True dropped: it needs CUDA, and the config rejects it on CPU")
        if self.amp:
            if device.type == "cuda":
                changes["precision.amp"] = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
            elif native_bf16_cpu():
                changes["precision.amp"] = "bf16"
            else:
                notes.append("AMP not added: this CPU has no native bf16 (neither AMX nor AVX512-BF16), and the CPU "
                             "guides recommend bf16 autocast only where it has")
        if self.compile_mode:
            changes["compile.mode"] = self.compile_mode
        return TrainConfig().with_changes(changes), notes

    def describe(self) -> dict[str, Any]:
        return {"num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor,
                "persistent_workers": self.persistent_workers, "pin_memory": self.pin_memory,
                "amp": self.amp, "compile_mode": self.compile_mode}


def native_bf16_cpu() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


RULE = RuleOfThumb()
# --quick keeps the rule's shape at a size a smoke test affords: no compile, 2 workers.
QUICK_RULE = RuleOfThumb(num_workers=2, prefetch_factor=2, amp=False, compile_mode=None)


def for_machine(cases: list[Case] | tuple[Case, ...], device: torch.device) -> list[Case]:
    """`cases` with their grids as measured on `device` (`Case.for_machine`), its lower
    precisions probed once (CPU only: a GPU's units are the rule there)."""
    fast = sorted(probe.fast(probe.lowp_matmul(device))) if device.type == "cpu" else []
    return [c.for_machine(fast) for c in cases]


def select(cases: tuple[Case, ...], names: str | None) -> list[Case]:
    """The cases named in a comma-separated list (all when None), in the suite's order."""
    if not names:
        return list(cases)
    wanted = [n.strip().removesuffix(".py") for n in names.split(",") if n.strip()]
    known = {c.name for c in cases}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise UserError(f"--examples {names!r}: unknown example(s) {', '.join(unknown) or '(none given)'}; "
                        f"known: {', '.join(c.name for c in cases)}.")
    return [c for c in cases if c.name in wanted]
