"""`autotune export`: the tuned config of a run as another framework's own settings.

`export(report, to)` renders `report.final_config` for one target:

- `yaml`: exactly the `tuned.yaml` that `autotune tune` writes;
- `hf`: `transformers.TrainingArguments` keyword arguments;
- `lightning`: `lightning.Trainer` keyword arguments and the `DataLoader` ones;
- `accelerate`: an `accelerate launch --config_file` YAML;
- `torchrun`: the launch command (`--nproc_per_node` is `distributed.world_size`), with its environment.

Each setting carries a comment saying what it gained (the accepted recommendation that
changed it: "dataloader measured 4.13x [3.88, 4.41]"). Only keys that differ from the
defaults are written, except those a target needs; a key a target cannot express is
written as a comment holding the PyTorch code line that does it. For `hf` and
`lightning` the text holds a literal Python dict (`ast.literal_eval` reads it back), and
`hf_kwargs`, `lightning_kwargs` and `lightning_dataloader_kwargs` return the same dicts.

Targets that need the workload's global batch size (a tuned `memory.micro_batch_size`
becomes a per-device batch plus gradient accumulation) read it from the report
(`batch_size`), or from `--batch-size N` for reports written before it was recorded.
"""

from __future__ import annotations

import json
from typing import Any

from .codeline import code_line
from .config import TrainConfig, from_flat, to_yaml
from .errors import UserError
from .record import Report
from .report.files import _gain, tuned_comments

__all__ = ["TARGETS", "export", "hf_kwargs", "lightning_dataloader_kwargs", "lightning_kwargs"]

TARGETS = ("yaml", "lightning", "hf", "accelerate", "torchrun")
_MAX_BATCH = 2**31 - 1


# --- what the report says ----------------------------------------------------------------

def _config(report: Report) -> TrainConfig:
    return TrainConfig() if report.final_config is None else from_flat(report.final_config, source="final config")


def _changed(config: TrainConfig) -> dict[str, Any]:
    """The keys that differ from the defaults, with their tuned values, in `KEYS` order."""
    return {k: v[1] for k, v in TrainConfig().diff(config).items()}


def gains(report: Report) -> dict[str, str]:
    """`{key: "<recipe> measured 1.23x [1.10, 1.37]"}` for each key an accepted recommendation changed."""
    out = {}
    for rec in report.recommendations:
        if rec.accepted:
            for key in rec.changes:
                out[key] = f"{rec.recipe} measured {_gain(rec)}"
    return out


def _note(key: str, found: dict[str, str]) -> str:
    return found.get(key, "tuned config")


def _batch(config: TrainConfig, batch_size: int | None, target: str, required: bool, recorded: int | None = None):
    """(per-device micro-batch, accumulation steps) keeping the global batch over the ranks, or (None, None)."""
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                   or not 1 <= batch_size <= _MAX_BATCH):
        raise UserError(f"--batch-size {batch_size!r}: give the workload's global batch size, a whole number from 1 to "
                        f"{_MAX_BATCH}.")
    batch_size = batch_size if batch_size is not None else recorded  # the flag wins over the report
    batch_size = batch_size // config.distributed.world_size if batch_size is not None else None  # per rank (DDP)
    micro = config.memory.micro_batch_size
    if micro is None:
        return (batch_size, 1) if batch_size is not None else (None, None)
    if batch_size is None:
        if required:
            raise UserError(f"the tuned config splits each batch into micro-batches of {micro} "
                            f"(memory.micro_batch_size), and --to {target} needs the global batch size to set the "
                            "gradient accumulation that keeps it, but this report.json does not record it: give "
                            "--batch-size N (the Workload's batch_size), or batch_size=N from Python.")
        return micro, None
    if micro > batch_size or batch_size % micro:
        raise UserError(f"--batch-size {batch_size}: the tuned memory.micro_batch_size {micro} does not divide it; "
                        "give the batch size of the workload that was tuned.")
    return micro, batch_size // micro


def _header(report: Report, target: str, prefix: str = "#") -> list[str]:
    lines = [(f"{prefix} autotune export --to {target}: {report.workload} (tuned on {report.device}, "
              f"autotune {report.autotune_version})")]
    sp = report.speedup
    if sp is not None and sp.measured:
        lines.append(f"{prefix} the tuned config measured {sp.ratio:.2f}x [{sp.low:.2f}, {sp.high:.2f}] over the baseline")
    if not report.complete:
        lines.append(f"{prefix} NOTE: this report is partial ({report.stop_reason or 'the run was stopped'}); "
                     "rerun `autotune tune` to finish it")
    return lines


# --- Hugging Face TrainingArguments ------------------------------------------------------

def _hf(report: Report, batch_size: int | None) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(kwargs, a comment per kwarg, comment lines for keys TrainingArguments cannot express)."""
    config = _config(report)
    changed, found = _changed(config), gains(report)
    kw: dict[str, Any] = {}
    notes: dict[str, str] = {}
    extra: list[str] = []

    def put(name: str, value: Any, note: str) -> None:
        kw[name] = value
        notes[name] = note

    d = config.data
    if "data.num_workers" in changed:
        put("dataloader_num_workers", d.num_workers, _note("data.num_workers", found))
    if "data.prefetch_factor" in changed:
        put("dataloader_prefetch_factor", d.prefetch_factor, _note("data.prefetch_factor", found))
    # TrainingArguments pins memory unless told not to, autotune does not: always say which.
    put("dataloader_pin_memory", d.pin_memory, _note("data.pin_memory", found) if "data.pin_memory" in changed
        else "autotune's default (TrainingArguments defaults to True)")
    if "data.persistent_workers" in changed:
        put("dataloader_persistent_workers", d.persistent_workers, _note("data.persistent_workers", found))
    if config.precision.amp != "none":
        put("bf16" if config.precision.amp == "bf16" else "fp16", True, _note("precision.amp", found))
    if "precision.tf32" in changed:
        put("tf32", config.precision.tf32, _note("precision.tf32", found))
    if config.compile.mode != "none":
        put("torch_compile", True, _note("compile.mode", found))
        put("torch_compile_mode", config.compile.mode, _note("compile.mode", found))
    micro, accum = _batch(config, batch_size, "hf", required=config.memory.micro_batch_size is not None,
                          recorded=report.batch_size)
    if micro is not None:
        why = _note("memory.micro_batch_size", found) if "memory.micro_batch_size" in changed else "the workload's batch"
        put("per_device_train_batch_size", micro, why)
        put("gradient_accumulation_steps", accum, f"{why}; keeps the global batch of {micro * accum * config.distributed.world_size}")
    if config.memory.activation_checkpointing:
        put("gradient_checkpointing", True, _note("memory.activation_checkpointing", found))
    if config.optimizer.impl == "fused":
        put("optim", "adamw_torch_fused", _note("optimizer.impl", found))
    if config.data.non_blocking:
        put("accelerator_config", {"non_blocking": True}, _note("data.non_blocking", found))
    if "distributed.bucket_cap_mb" in changed:
        put("ddp_bucket_cap_mb", max(1, round(config.distributed.bucket_cap_mb)), _note("distributed.bucket_cap_mb", found))
    for key in ("optimizer.impl", "layout.channels_last", "attention.backend", "backend.cudnn_benchmark",
                "backend.num_threads", "distributed.world_size", "distributed.gradient_as_bucket_view",
                "distributed.static_graph"):
        if key not in changed or (key == "optimizer.impl" and config.optimizer.impl == "fused"):
            continue
        value = changed[key]
        line = code_line(key, value, report.device)
        if key == "optimizer.impl":
            line += "  (no TrainingArguments flag: optim='adamw_torch' lets torch pick foreach on CUDA)"
        extra.append(f"# {key}: {value!r} ({_note(key, found)}); no TrainingArguments key: {line}")
    return kw, notes, extra


def hf_kwargs(report: Report, batch_size: int | None = None) -> dict[str, Any]:
    """`transformers.TrainingArguments` keyword arguments for the tuned config.

    Args:
        report: The run (`load_report(DIR)`).
        batch_size: The workload's global batch; needed when the config tuned
            `memory.micro_batch_size` (it becomes `per_device_train_batch_size` and
            `gradient_accumulation_steps = batch_size // micro`).

    Raises:
        UserError: The batch size is needed but missing, or the micro-batch does not divide it.
    """
    return _hf(report, batch_size)[0]


# --- Lightning ---------------------------------------------------------------------------

def _lightning(report: Report, batch_size: int | None):
    config = _config(report)
    changed, found = _changed(config), gains(report)
    trainer: dict[str, Any] = {}
    tnotes: dict[str, str] = {}
    if config.precision.amp != "none":
        trainer["precision"] = "bf16-mixed" if config.precision.amp == "bf16" else "16-mixed"
        tnotes["precision"] = _note("precision.amp", found)
    micro, accum = _batch(config, batch_size, "lightning", required=config.memory.micro_batch_size is not None,
                          recorded=report.batch_size)
    if accum is not None and accum > 1:
        trainer["accumulate_grad_batches"] = accum
        tnotes["accumulate_grad_batches"] = (f"{_note('memory.micro_batch_size', found)}; micro-batches of {micro} "
                                             f"keep the global batch of {micro * accum * config.distributed.world_size}")
    loader: dict[str, Any] = {}
    lnotes: dict[str, str] = {}
    if micro is not None:
        loader["batch_size"] = micro
        lnotes["batch_size"] = (_note("memory.micro_batch_size", found) if "memory.micro_batch_size" in changed
                                else "the workload's batch")
    d = config.data
    for name in ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers"):
        if f"data.{name}" in changed:
            loader[name] = getattr(d, name)
            lnotes[name] = _note(f"data.{name}", found)
    code: list[str] = []
    if config.compile.mode != "none":
        call = "torch.compile(model)" if config.compile.mode == "default" else \
            f"torch.compile(model, mode={config.compile.mode!r})"
        code.append(f"model = {call}  # {_note('compile.mode', found)}; compile the LightningModule before fit")
    if config.memory.activation_checkpointing:
        code.append(f"# memory.activation_checkpointing ({_note('memory.activation_checkpointing', found)}): "
                    f"{code_line('memory.activation_checkpointing', True)}")
    ddp = {k.split(".", 1)[1]: v for k, v in changed.items() if k.startswith("distributed.") and k != "distributed.world_size"}
    if config.distributed.world_size > 1:
        trainer["devices"], tnotes["devices"] = config.distributed.world_size, "the workload's world size (a process a rank)"
    if ddp:
        code.append(f"trainer_kwargs['strategy'] = lightning.pytorch.strategies.DDPStrategy("
                    f"{', '.join(f'{k}={v!r}' for k, v in ddp.items())})  # {_note('distributed.bucket_cap_mb', found)}")
    for key in ("precision.tf32", "layout.channels_last", "attention.backend", "optimizer.impl",
                "backend.cudnn_benchmark", "backend.num_threads", "data.non_blocking"):
        if key not in changed:
            continue
        line = code_line(key, changed[key], report.device)
        if key == "optimizer.impl":
            line += "  (in configure_optimizers)"
        if key == "data.non_blocking":
            line = "Lightning already copies batches to CUDA with non_blocking=True"
        code.append(f"# {key}: {changed[key]!r} ({_note(key, found)}): {line}")
    return trainer, tnotes, loader, lnotes, code


def lightning_kwargs(report: Report, batch_size: int | None = None) -> dict[str, Any]:
    """`lightning.Trainer` keyword arguments for the tuned config (precision, accumulate_grad_batches).

    Raises:
        UserError: As `hf_kwargs`.
    """
    return _lightning(report, batch_size)[0]


def lightning_dataloader_kwargs(report: Report, batch_size: int | None = None) -> dict[str, Any]:
    """`torch.utils.data.DataLoader` keyword arguments for the tuned config (the micro-batch as
    `batch_size` when the global batch is known or a micro-batch was tuned)."""
    return _lightning(report, batch_size)[2]


# --- rendering ---------------------------------------------------------------------------

def _dict_lines(name: str, kw: dict[str, Any], notes: dict[str, str]) -> list[str]:
    """`name = {` ... `}`: a literal `ast.literal_eval` reads back, one commented key a line."""
    lines = [f"{name} = {{"]
    for key, value in kw.items():
        lines.append(f"    {key!r}: {value!r},  # {_one_line(notes.get(key, ''))}".rstrip(" #"))
    lines.append("}")
    return lines


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _render_hf(report: Report, batch_size: int | None) -> str:
    kw, notes, extra = _hf(report, batch_size)
    lines = _header(report, "hf")
    lines.append("from transformers import TrainingArguments")
    lines.append("")
    lines += _dict_lines("training_args", kw, notes)
    lines.append("args = TrainingArguments(output_dir=\"out\", **training_args)")
    lines += extra
    return "\n".join(lines) + "\n"


def _render_lightning(report: Report, batch_size: int | None) -> str:
    trainer, tnotes, loader, lnotes, code = _lightning(report, batch_size)
    lines = _header(report, "lightning")
    lines += ["import lightning", "import torch", "from torch.utils.data import DataLoader", ""]
    lines += _dict_lines("trainer_kwargs", trainer, tnotes)
    lines += _dict_lines("dataloader_kwargs", loader, lnotes)
    lines += code
    lines += ["train_loader = DataLoader(train_dataset, shuffle=True, **dataloader_kwargs)",
              "trainer = lightning.Trainer(**trainer_kwargs)",
              "trainer.fit(model, train_loader)"]
    return "\n".join(lines) + "\n"


def _render_accelerate(report: Report, batch_size: int | None) -> str:
    config = _config(report)
    changed, found = _changed(config), gains(report)
    amp = {"none": "'no'", "bf16": "bf16", "fp16": "fp16"}[config.precision.amp]
    amp_note = _note("precision.amp", found) if "precision.amp" in changed else "autotune's default: no autocast"
    lines = _header(report, "accelerate")
    lines.append("# use: accelerate launch --config_file accelerate.yaml train.py")
    world = config.distributed.world_size  # a process a rank
    lines += ["compute_environment: LOCAL_MACHINE", "distributed_type: " + ("'NO'" if world == 1 else
              f"MULTI_{'GPU' if report.device == 'cuda' else 'CPU'}"), "num_machines: 1", f"num_processes: {world}",
              "machine_rank: 0", f"use_cpu: {'true' if report.device == 'cpu' else 'false'}",
              f"mixed_precision: {amp}  # {amp_note}"]
    micro, accum = _batch(config, batch_size, "accelerate", required=config.memory.micro_batch_size is not None,
                          recorded=report.batch_size)
    if accum is not None and accum > 1:
        # accelerate's config file has no such key outside deepspeed_config (it refuses unknown keys).
        lines.append(f"# gradient_accumulation_steps: {accum} ({_note('memory.micro_batch_size', found)}): "
                     f"Accelerator(gradient_accumulation_steps={accum}) with DataLoader(..., batch_size={micro}) "
                     f"keeps the global batch of {micro * accum * config.distributed.world_size} (or ACCELERATE_GRADIENT_ACCUMULATION_STEPS={accum} "
                     "in the environment); accelerate's config file has no key for it")
    if config.compile.mode != "none":
        note = _note("compile.mode", found)
        lines += ["dynamo_config:", f"  dynamo_backend: INDUCTOR  # {note}"]
        if config.compile.mode != "default":
            lines.append(f"  dynamo_mode: {config.compile.mode}  # {note}")
    if config.data.non_blocking:
        lines.append("# data.non_blocking: Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))"
                     f"  # {_note('data.non_blocking', found)}")
    for key, value in changed.items():
        if key in ("precision.amp", "compile.mode", "memory.micro_batch_size", "data.non_blocking", "distributed.world_size"):
            continue
        lines.append(f"# {key}: {json.dumps(value)} ({_note(key, found)}): {code_line(key, value, report.device)}")
    return "\n".join(lines) + "\n"


def _render_torchrun(report: Report, batch_size: int | None) -> str:
    config = _config(report)
    changed, found = _changed(config), gains(report)
    _, accum = _batch(config, batch_size, "torchrun", required=False, recorded=report.batch_size)
    lines = _header(report, "torchrun")
    lines.append("# settings torchrun cannot pass; put these lines in train.py:")
    for key, value in changed.items():
        if key in ("backend.num_threads", "distributed.world_size"):
            continue
        lines.append(f"#   {key}: {json.dumps(value)} ({_note(key, found)}): "
                     f"{code_line(key, value, report.device, accum)}")
    env = ""
    if config.backend.num_threads is not None:
        lines.append(f"# backend.num_threads: {config.backend.num_threads} ({_note('backend.num_threads', found)}): "
                     "OMP_NUM_THREADS (torchrun would set it to 1 otherwise)")
        env = f"OMP_NUM_THREADS={config.backend.num_threads} "
    lines.append(f"{env}torchrun --standalone --nproc_per_node={config.distributed.world_size} train.py")
    return "\n".join(lines) + "\n"


def export(report: Report, to: str, batch_size: int | None = None) -> str:
    """The tuned config of `report` as `to`'s own settings, commented with what each gained.

    Args:
        report: The run (`autotune.report.load_report(DIR)`).
        to: One of `TARGETS`: yaml, lightning, hf, accelerate, torchrun.
        batch_size: The workload's global batch (report.json does not record it); needed by
            hf, lightning and accelerate when the config tuned `memory.micro_batch_size`.

    Returns:
        The text to write (a file of the target's kind).

    Raises:
        UserError: An unknown target, a missing or bad batch size.
    """
    if to not in TARGETS:
        raise UserError(f"--to {to!r} is not a known target; give one of {', '.join(TARGETS)}.")
    if to == "yaml":
        return to_yaml(_config(report), tuned_comments(report))
    return {"hf": _render_hf, "lightning": _render_lightning, "accelerate": _render_accelerate,
            "torchrun": _render_torchrun}[to](report, batch_size)
