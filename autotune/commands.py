"""What each CLI command does, between parsing (cli) and the modules that do the work."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from . import console as ui
from .atomic import write_text
from .config import TrainConfig, load_config
from .diagnose import ADVICE, diagnose
from .errors import UserError
from .loop import Trainer, has_conv, resolve_device
from .measure import Protocol, measure
from .recipes import load_recipes, matching
from .units import parse_size
from .workload import Workload, load_workload


def protocol_from(args) -> Protocol:
    kw = {}
    for flag, field in (("windows", "windows"), ("steps", "steps"), ("warmup", "warmup_steps")):
        v = getattr(args, flag, None)
        if v is not None:
            if v < (1 if flag != "warmup" else 0):
                raise UserError(f"--{flag} {v} is too small; give a positive number.")
            kw[field] = v
    if kw.get("windows", 2) < 2:
        raise UserError("--windows must be at least 2, so the spread between windows can be measured.")
    return Protocol(seed=args.seed, **kw)


def workload_facts(workload: Workload) -> dict[str, bool]:
    """What recipes may require, found by looking at the model."""
    torch.manual_seed(0)
    from .errors import call_user

    model = call_user("the workload's model factory", workload.model)
    return {"conv": has_conv(model), "checkpoint_blocks": bool(workload.checkpoint_blocks)}


def _writable(path: str, flag: str) -> Path:
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(p.parent, os.W_OK):
            raise PermissionError
    except (OSError, PermissionError):
        raise UserError(f"{flag} {path!r}: cannot write there; give a path in a writable folder.") from None
    return p


def profile(args) -> int:
    json_path = _writable(args.json, "--json") if args.json else None
    trace_path = _writable(args.trace, "--trace") if args.trace else None
    limit = parse_size(args.memory_limit) if args.memory_limit else None
    device = resolve_device(args.device)
    protocol = protocol_from(args)
    workload = load_workload(args.target)
    recipes = load_recipes()
    config = TrainConfig()
    with ui.progress() as prog:
        task = prog.add_task(f"measuring {workload.name}", total=protocol.windows, note="")
        m = measure(workload, config, device, protocol, str(trace_path) if trace_path else None,
                    on_window=lambda i, w: prog.update(task, advance=1, note=f"{w.samples_per_s:.0f} samples/s"))
    summary = m.summary()
    verdict = diagnose(summary, device.type, limit)
    facts = workload_facts(workload)
    fits = matching(recipes, verdict.bottleneck, device.type, facts)
    c = ui.console
    c.print(f"[bold]{workload.name}[/] on {device.type}, batch {workload.batch_size}, default config")
    for line in ui.measurement_lines(summary):
        c.print(line)
    c.print(ui.stage_table(summary))
    for line in ui.verdict_lines(verdict.to_dict()):
        c.print(line)
    if fits:
        c.print(ui.recipe_table(fits, device.type, facts, title="Recipes that match, cheapest first"))
    else:
        c.print("No recipe targets this bottleneck: " + ADVICE.get(verdict.bottleneck, "see the evidence above."))
    if json_path:
        doc = {
            "workload": workload.name, "device": device.type, "protocol": protocol.describe(),
            "measurement": summary, "diagnosis": verdict.to_dict(), "memory_limit_bytes": limit,
            "recipes": [r.name for r in fits],
        }
        write_text(json_path, json.dumps(doc, indent=2, default=str))
        c.print(f"wrote {json_path}")
    if trace_path:
        c.print(f"wrote trace {trace_path} (open in https://ui.perfetto.dev or chrome://tracing)")
    return 0


def recipes(args) -> int:
    rs = load_recipes(args.recipes)
    ui.console.print(ui.recipe_table(rs))
    for r in rs:
        ui.console.print(f"[bold]{r.name}[/] trade-offs: {r.tradeoffs}")
    return 0


def train(args) -> int:
    config = load_config(args.config)
    device = resolve_device(args.device)
    workload = load_workload(args.target)
    if args.steps < 1:
        raise UserError(f"--steps {args.steps}: give a positive number of steps.")
    t0 = time.perf_counter()
    trainer = Trainer(workload, config, device, seed=args.seed)
    setup = time.perf_counter() - t0
    warm = min(TRAIN_WARMUP, args.steps - 1)  # steps before the steady-state clock starts
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    stream, losses = trainer.batches(), []
    t0 = t_warm = time.perf_counter()
    for i in range(args.steps):
        if i == warm:
            sync()
            t_warm = time.perf_counter()
        losses.append(trainer.step(next(stream)))
    sync()
    t_end = time.perf_counter()
    losses = [float(x) for x in losses]
    steady = (args.steps - warm) * workload.batch_size / (t_end - t_warm)
    ui.console.print(
        f"[bold]{workload.name}[/]: {args.steps} steps with {config.short()} in {t_end - t0:.2f} s "
        f"(setup {setup:.2f} s); steady state after {warm} steps: {steady:.1f} samples/s; "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f}"
    )
    return 0


TRAIN_WARMUP = 5


def tune(args) -> int:
    from .tune_cmd import tune as run

    return run(args)


def report(args) -> int:
    from .report import rerender

    return rerender(args.dir)
