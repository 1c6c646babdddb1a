"""The `autotune` command line: an explicit table of commands, one function each.

This layer only parses flags, calls the modules that do the work, and renders what they
return; nothing below imports it.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import json
import signal
import sys
import time
from pathlib import Path

from . import flags
from .errors import UserCodeError, UserError, exit_code, explain

EXAMPLES = {
    "profile": "examples:\n  autotune profile train.py\n  autotune profile train.py --memory-limit 64MB --json profile.json --trace trace.json",
    "tune": "examples:\n  autotune tune train.py --out runs/train\n  autotune tune my_train.py:build --trials 30 --budget 20m --storage sqlite:///study.db\n  autotune tune train.py --workers 2 --out runs/train2",
    "train": "examples:\n  autotune train train.py --config runs/train/tuned.yaml --steps 200\n  autotune train ddp_train.py --config runs/ddp/tuned.yaml --steps 50",
    "worker": "examples:\n  AUTOTUNE_STORAGE=postgresql://tuner:PASSWORD@db-host/autotune autotune worker --study my-run\n  autotune worker --storage journal:///shared/runs/journal.log --study my-run --cores 0-7",
    "recipes": "examples:\n  autotune recipes\n  autotune recipes --recipes my_recipes/",
    "report": "examples:\n  autotune report runs/train\n  autotune report --schema > report.schema.json",
    "export": "examples:\n  autotune export runs/train --to hf --batch-size 64\n  autotune export runs/train --to lightning --out tuned_lightning.py\n  autotune export runs/train --to accelerate --out accelerate.yaml",
}
TRAIN_WARMUP = 5  # steps before `autotune train`'s steady-state clock starts

def _protocol(args, sized: bool = True):
    """The flags' protocol; `tune` sizes its windows from the baseline unless `--steps` is given."""
    from dataclasses import replace

    from .measure import Protocol

    p = Protocol.from_flags(args.seed, args.windows, args.steps, args.warmup)
    return p if sized else replace(p, window_s=None)


def profile(args: argparse.Namespace) -> int:
    from .atomic import write_text
    from .diagnose import ADVICE, diagnose
    from .loop import resolve_device
    from .measure import measure
    from .agent import MIN_GAIN
    from . import handoff, probe
    from .plan import Attempts, inapplicable, rank
    from .record import Bottleneck
    from .recipes import load_recipes
    from .report import terminal
    from .units import parse_size
    from .workload import facts, load_workload, with_world_size

    flags.check(args)
    taken: dict[Path, str] = {}
    json_path = flags.output_file(args.json, "--json", taken) if args.json else None
    trace_path = flags.output_file(args.trace, "--trace", taken) if args.trace else None
    limit = parse_size(args.memory_limit) if args.memory_limit is not None else None
    device = resolve_device(args.device)
    protocol = _protocol(args, sized=False)  # one measurement: its steps as given
    workload = with_world_size(load_workload(args.target), args.world_size)
    recipes = load_recipes()
    with terminal.progress() as prog:
        task = prog.add_task(f"measuring {workload.name}", total=protocol.windows, note="")
        m = measure(workload, workload.base_config(), device, protocol, str(trace_path) if trace_path else None,
                    on_window=lambda i, w: prog.update(task, advance=1, note=f"{w.samples_per_s:.0f} samples/s"))
    summary = m.summary()
    verdict = diagnose(summary, device.type, limit)
    found = facts(workload)
    # What `autotune tune` would try first, by expected gain per second (no A/A here: the bar is MIN_GAIN).
    lowp = probe.lowp_matmul(device)
    hand = handoff.batch_handoff_s(workload, protocol.seed) if any(w.cls is Bottleneck.INPUT for w in verdict.wastes) \
        else None  # what a worker's batch costs to receive: whether workers can shorten the wait
    share = handoff.step_share(hand, workload.base_config(), summary)
    fits = [c.recipe for c in rank(recipes, verdict, device.type, found, Attempts(), 1 + MIN_GAIN, lowp=lowp,
                                   handoff=share, trial_s=summary.wall_s)]
    why_not = handoff.why_not(hand, summary, verdict, share, 1 + MIN_GAIN)  # an input waste workers cannot shorten
    left_out = [f"not listed: {', '.join(r.name for r in recipes if r.moves_loading())}: {why_not}"] if why_not else []
    if cannot := inapplicable(recipes, verdict, device.type, found, 1 + MIN_GAIN):
        left_out.append(f"not listed: {cannot}")
    terminal.print_profile(workload.name, device.type, workload.batch_size, summary, verdict, fits, found,
                           next((ADVICE[w.cls] for w in verdict.wastes if w.cls in ADVICE), "see the evidence above."),
                           left_out)
    if json_path:
        doc = {
            "workload": workload.name, "device": device.type, "protocol": protocol.describe().model_dump(mode="json"),
            "measurement": summary.model_dump(mode="json"), "diagnosis": verdict.model_dump(mode="json"),
            "memory_limit_bytes": limit, "recipes": [r.name for r in fits], "lowp_matmul": lowp,
            "batch_handoff_s": hand, "not_listed": left_out,
        }
        write_text(json_path, json.dumps(doc, indent=2))
        terminal.console.print(f"wrote {terminal.escape(str(json_path))}")
    if trace_path:
        terminal.console.print(f"wrote trace {terminal.escape(str(trace_path))} (open in https://ui.perfetto.dev or chrome://tracing)")
    return 0


def tune(args: argparse.Namespace) -> int:
    from .agent import Agent, Settings
    from .faults import checkpoint
    from .identity import Resume
    from .lock import FolderLock
    from .loop import resolve_device
    from .recipes import load_recipes, select
    from .report import terminal, write_outputs
    from .runner import Runner
    from .storage import open_storage, redact, storage_url, study_name
    from .units import parse_duration, parse_size
    from .workload import facts, load_workload, with_world_size

    flags.check(args)
    budget = parse_duration(args.budget) if args.budget is not None else None
    limit = parse_size(args.memory_limit) if args.memory_limit is not None else None
    timeout = parse_duration(args.trial_timeout, "--trial-timeout")
    device = resolve_device(args.device)
    out = flags.output_dir(args.out)
    recipes = load_recipes(args.recipes)
    only = select(recipes, args.only)
    protocol = _protocol(args)
    workload = with_world_size(load_workload(args.target), args.world_size)
    url = storage_url(args.storage, out)
    with FolderLock(out):  # one run per output folder: two would measure on the same cores
        storage = open_storage(url, shared=args.workers is not None)
        pool = _pool(args, storage, url, device, out)
        runner = Runner(workload, args.target, device, protocol, isolate=not args.in_process, timeout_s=timeout)
        agent = Agent(runner, recipes, storage, args.study or study_name(workload.name),
                      Settings(args.trials, budget, limit, args.seed, only, Resume(args.resume)), facts(workload),
                      storage_label=redact(url), pool=pool)
        if agent.study_note:
            terminal.console.print(terminal.escape(agent.study_note))
        code, failure = _run_agent(agent, terminal)
        report = agent.report
        if report.baseline is None:
            terminal.console.print("stopped before the baseline was measured: nothing to report")
        else:
            checkpoint("report")
            write_outputs(report, out)
            terminal.print_tune_summary(report, out)
    if failure is not None:
        raise failure  # after the report: the CLI turns it into its exit code and message
    return code


def _pool(args, storage, url: str, device, out: Path):
    from .pool import from_flags

    if args.workers is not None:
        flags.bounded(args.workers, "--workers", 0, 1024, " (local worker processes; 0: only workers started elsewhere)")
        if args.in_process:
            raise UserError("--in-process and --workers exclude each other: workers measure in processes of their own.")
    return from_flags(args.workers, storage, url, device, out)


def worker(args: argparse.Namespace) -> int:
    from .serve import serve
    from .storage import ENV_VAR, open_storage
    from .units import parse_duration

    flags.check(args)
    url = args.storage if args.storage is not None else os.environ.get(ENV_VAR)
    if not url or not url.strip():
        raise UserError(f"autotune worker needs the run's storage: --storage URL or ${ENV_VAR} (which keeps a "
                        "password out of ps), the same the coordinating `autotune tune` uses.")
    idle = parse_duration(args.idle_timeout, "--idle-timeout") if args.idle_timeout not in ("0", "never") else 0.0
    if args.cores is not None:
        from .pool import pin

        pin(args.cores)
    if os.environ.get("AUTOTUNE_PARENT_PID"):  # started by `autotune tune --workers`: die with it
        from .worker import _die_with_parent

        _die_with_parent()
    from .shutdown import Stopped, stop_on_signals

    with stop_on_signals():
        try:
            n = serve(open_storage(url, shared=True), args.study, None if args.device == "auto" else args.device, idle,
                      lambda s: print(f"[{time.strftime('%H:%M:%S')}] {s}", flush=True))
        except Stopped as exc:  # its trial, if any, was given back to the queue
            print(f"stopped by {exc.name}", file=sys.stderr)
            return exc.exit_code
    print(f"measured {n} trial(s)")
    return 0


def _run_agent(agent, terminal) -> tuple[int, BaseException | None]:
    """Run the loop; every way it can end leaves a report (marked partial, with why)."""
    from .errors import EXIT_INTERRUPTED
    from .shutdown import Stopped, stop_on_signals

    resume = "the report holds what was measured; rerun the same command to resume"
    with terminal.progress() as prog, stop_on_signals():
        agent.events = terminal.Display(prog)
        try:
            agent.run()
            return 0, None
        except KeyboardInterrupt:
            agent.report.stop_reason = f"interrupted (Ctrl-C): {resume}"
            return EXIT_INTERRUPTED, None
        except Stopped as exc:
            agent.report.stop_reason = f"stopped by {exc.name}: {resume}"
            return exc.exit_code, None
        except Exception as exc:  # noqa: BLE001 - reported after the partial report is written
            agent.report.stop_reason = f"failed ({type(exc).__name__}: {str(exc)[:300]}): {resume}"
            return 1, exc


def train(args: argparse.Namespace) -> int:
    from .config import load_config
    from .loop import resolve_device, train_ranks
    from .report import terminal
    from .workload import load_workload, with_world_size

    flags.check(args)
    config = load_config(args.config)
    device = resolve_device(args.device)
    workload = with_world_size(load_workload(args.target), args.world_size)
    warm = min(TRAIN_WARMUP, args.steps - 1)
    run, setup = train_ranks(workload, config, device, args.seed, args.steps, warm)
    terminal.console.print(
        f"[bold]{terminal.escape(workload.name)}[/]: {args.steps} steps with {terminal.escape(config.short())} in "
        f"{run.wall_s:.2f} s (setup {setup:.2f} s); steady state after {warm} steps: "
        f"{run.steady_samples_per_s(workload.batch_size):.1f} samples/s; loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f}"
    )
    return 0


def recipes(args: argparse.Namespace) -> int:
    from .recipes import load_recipes
    from .report import terminal

    rs = load_recipes(args.recipes)
    terminal.console.print(terminal.recipe_table(rs))
    for r in rs:
        terminal.console.print(f"[bold]{terminal.escape(r.name)}[/] trade-offs: {terminal.escape(r.tradeoffs)}")
    return 0


def report(args: argparse.Namespace) -> int:
    from .record import report_schema
    from .report import rerender

    if args.schema:
        sys.stdout.write(json.dumps(report_schema(), indent=2) + "\n")
        return 0
    if args.dir is None:
        raise UserError("autotune report needs a tune output folder (autotune report DIR), or --schema.")
    flags.check(args)
    written = rerender(Path(args.dir))
    print("wrote " + " and ".join(str(p) for p in written))
    return 0


def export(args: argparse.Namespace) -> int:
    from .atomic import write_text
    from .export import export as render
    from .report import load_report

    flags.check(args)
    if args.batch_size is not None:
        flags.bounded(args.batch_size, "--batch-size", 1, 2**31 - 1, " (the workload's global batch size)")
    out = flags.output_file(args.out, "--out", {}) if args.out else None
    text = render(load_report(Path(args.dir)), args.to, args.batch_size)
    if out is None:
        sys.stdout.write(text)
        return 0
    try:
        write_text(out, text)
    except OSError as exc:
        raise UserError(f"--out {args.out!r} cannot be written ({exc.strerror or exc}); give a writable file.") from None
    print(f"wrote {out}")
    return 0


_COMMANDS = {
    "profile": (profile, "measure and diagnose a training step; changes nothing"),
    "tune": (tune, "the whole loop: diagnose, search fixes, keep what measurably helps"),
    "train": (train, "train with a config through the very loop that was measured"),
    "worker": (worker, "measure the trials a coordinating `autotune tune` run puts in a shared storage"),
    "recipes": (recipes, "the recipe ladder, cheapest first, with what each targets"),
    "report": (report, "render the reports again from a tune output folder"),
    "export": (export, "write the tuned config as Hugging Face, Lightning, accelerate or torchrun settings"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in the same one-paragraph form as every other bad input."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        hint = ""
        if "expected one argument" in message:
            hint = " (a value that starts with '-' must be written --flag=VALUE)"
        self.exit(2, f"error: {message}{hint}; see `{self.prog} --help` for the flags.\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autotune", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    cmds = {}
    for name, (_, help_text) in _COMMANDS.items():
        cmds[name] = sub.add_parser(name, help=help_text, description=help_text, epilog=EXAMPLES[name],
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("profile", "tune", "train"):
        c = cmds[name]
        c.add_argument("target", help="file.py, file.py:func or package.module:func returning autotune.Workload")
        c.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
        c.add_argument("--world-size", type=int, help="DDP processes on this machine, overriding the workload's "
                       "world_size (default: the workload's)")
    for name in ("profile", "tune"):
        c = cmds[name]
        c.add_argument("--memory-limit", help="peak memory allowed, like 512MB or 2GiB")
        c.add_argument("--seed", type=int, default=0, help="model init and data order, 0 to 2**32-1 (default 0)")
        c.add_argument("--windows", type=int, help="measured windows per config (default 5)")
        c.add_argument("--steps", type=int, help="measured steps per window, at least (default 12; tune raises it "
                       "so that the baseline's windows last 0.5 s, unless given)")
        c.add_argument("--warmup", type=int, help="warm-up steps per window (default 3)")
    cmds["profile"].add_argument("--json", help="write the measurement and diagnosis as JSON to FILE")
    cmds["profile"].add_argument("--trace", help="write a Chrome/Perfetto trace of the profiled steps to FILE")
    t = cmds["tune"]
    t.add_argument("--trials", type=int, default=40, help="most trials over all recipes (default 40)")
    t.add_argument("--budget", help="wall-clock budget, like 10m or 1h (default none)")
    t.add_argument("--out", default="autotune-out", help="output folder (default autotune-out)")
    t.add_argument("--storage", help="Optuna storage URL (default: $AUTOTUNE_STORAGE when set, which keeps a password "
                   "out of ps and the shell history; else a sqlite file in --out)")
    t.add_argument("--study", help="study name (default: derived from the workload name)")
    t.add_argument("--recipes", help="folder of extra or overriding recipe files")
    t.add_argument("--only", help="comma-separated recipe names to consider (default all)")
    t.add_argument("--in-process", action="store_true", help="run trials in this process (faster, no crash isolation)")
    t.add_argument("--resume", choices=("auto", "strict", "new"), default="auto",
                   help="auto: resume the study when this run's fingerprint (target, protocol, device, cores, memory "
                        "limit, recipes, versions) matches, else use a study of its own; strict: refuse when it "
                        "differs; new: always start afresh (default auto)")
    t.add_argument("--trial-timeout", default="10m", help="a trial taking longer fails as hung (default 10m)")
    t.add_argument("--workers", type=int, help="measure search trials in parallel: start N local workers, each on "
                   "cores (or a GPU) of its own; `autotune worker` processes elsewhere join through --storage "
                   "(0: only those). Default: trials one at a time in this process's children")
    w = cmds["worker"]
    w.add_argument("--storage", help="the run's Optuna storage URL (default: $AUTOTUNE_STORAGE)")
    w.add_argument("--study", required=True, help="the study name the coordinating `autotune tune` printed")
    w.add_argument("--device", default="auto", help="auto (the run's device), cpu or cuda")
    w.add_argument("--cores", help="pin to these CPU cores, like 0-3 or 0,2 (default: all this process may use)")
    w.add_argument("--idle-timeout", default="30m", help="leave after this long with nothing to measure; 0: never "
                   "(default 30m; a worker also leaves when the run is done)")
    r = cmds["train"]
    r.add_argument("--config", required=True, help="a tuned.yaml written by autotune tune")
    r.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    r.add_argument("--seed", type=int, default=0)
    cmds["recipes"].add_argument("--recipes", help="folder of extra or overriding recipe files")
    cmds["report"].add_argument("dir", nargs="?", help="a tune output folder")
    cmds["report"].add_argument("--schema", action="store_true", help="print the JSON schema of report.json and exit")
    e = cmds["export"]
    e.add_argument("dir", help="a tune output folder (holding report.json)")
    e.add_argument("--to", required=True, choices=("yaml", "lightning", "hf", "accelerate", "torchrun"),
                   help="the framework whose settings to write")
    e.add_argument("--out", help="write to FILE (default: print)")
    e.add_argument("--batch-size", type=int, help="the workload's global batch size; needed by hf, lightning and "
                   "accelerate when the tuned config uses micro-batches (report.json does not record it)")
    return p


def main(argv: list[str] | None = None) -> int:
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID`: every thread's stack on stderr (where is it stuck?)
        try:
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
        except (AttributeError, ValueError, OSError):  # no real stderr to write to
            pass
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command][0](args)
    except (UserError, UserCodeError, KeyboardInterrupt) as exc:
        print(explain(exc), file=sys.stderr)
        return exit_code(exc)
    except Exception as exc:  # noqa: BLE001 - only the storage's own failures are turned into a message
        from .storage import failure_message as storage_failure

        message = storage_failure(exc, getattr(args, "storage", None) or os.environ.get("AUTOTUNE_STORAGE"))
        if message is None:
            raise
        print(explain(UserError(message)), file=sys.stderr)
        return exit_code(UserError(message))


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
