"""`autotune tune`: set up storage and output, run the agent with a live display, write
the reports and the tuned config, also when interrupted."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import optuna

from . import console as ui
from .agent import Agent, Settings
from .config import TrainConfig, from_dict, save_config
from .errors import UserError
from .loop import resolve_device
from .recipes import load_recipes
from .runner import Runner
from .units import parse_duration, parse_size
from .workload import load_workload


def redact(url: str) -> str:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a SQLAlchemy URL: hide anything that looks like a password
        return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def open_storage(url: str):
    try:
        return optuna.storages.get_storage(url)
    except Exception as exc:  # noqa: BLE001 - any failure to open storage is the URL's
        msg = str(exc).replace(url, redact(url))
        raise UserError(
            f"--storage {redact(url)!r} cannot be opened ({type(exc).__name__}: {msg.splitlines()[0][:300]}); "
            "give an Optuna storage URL such as sqlite:///path/study.db or postgresql://user:pass@host/db."
        ) from None


def _out_dir(path: str) -> Path:
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".autotune-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"--out {path!r} is not a writable folder ({exc.strerror}); give a folder you can write to.") from None
    return out


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "workload"


def write_outputs(report: dict[str, Any], out: Path) -> None:
    from .report import write_reports

    write_reports(report, out)
    final = from_dict(report.get("final_config") or {}, source="final config")
    comments = {}
    for rec in report.get("recommendations", []):
        if not rec["accepted"]:
            continue
        gain = f"{rec['speedup']:.2f}x [{rec['ci'][0]:.2f}, {rec['ci'][1]:.2f}]" if rec.get("speedup") else "fits the memory limit"
        for key, (old, _) in rec["changes"].items():
            desc = TrainConfig.model_fields[key.split(".")[0]].annotation.model_fields[key.split(".")[1]].description
            comments[key] = f"{desc} Was {json.dumps(old)}; {rec['recipe']} measured {gain}"
    save_config(final, out / "tuned.yaml", comments)


class Display:
    """The live progress: phase, trial i/N, best so far, elapsed/remaining."""

    def __init__(self, prog) -> None:
        self.prog, self.task, self.best = prog, None, None

    def __call__(self, kind: str, info: dict) -> None:
        p = self.prog
        if kind in ("phase", "compare"):
            label = info.get("name") or f"comparing {info['what']}"
            if self.task is not None:
                p.remove_task(self.task)
            self.task = p.add_task(label, total=None, note="")
        elif kind == "recipe":
            if self.task is not None:
                p.remove_task(self.task)
            self.best = None
            self.task = p.add_task(f"round {info['round']}: {info['recipe']}", total=info["trials"], note="")
        elif kind == "trial":
            v = info["samples_per_s"]
            if v is not None and (self.best is None or v > self.best):
                self.best = v
            note = f"best {self.best:.0f} samples/s" if self.best else (info.get("reason") or "")[:60]
            p.update(self.task, advance=1, note=note)
        elif kind == "decision":
            mark = "[green]accepted[/]" if info["accepted"] else "[yellow]rejected[/]"
            p.console.print(f"{info['recipe']}: {mark}: {info['reason']}")


def tune(args) -> int:
    trials = args.trials
    if trials < 1:
        raise UserError(f"--trials {trials}: give a positive number of trials.")
    budget = parse_duration(args.budget) if args.budget else None
    limit = parse_size(args.memory_limit) if args.memory_limit else None
    timeout = parse_duration(args.trial_timeout, "--trial-timeout")
    device = resolve_device(args.device)
    out = _out_dir(args.out)
    recipes = load_recipes(args.recipes)
    only = tuple(x.strip() for x in args.only.split(",")) if args.only else ()
    unknown = [x for x in only if x not in {r.name for r in recipes}]
    if unknown:
        raise UserError(f"--only names unknown recipe(s) {', '.join(unknown)}; known: {', '.join(r.name for r in recipes)}.")
    from .commands import protocol_from, workload_facts

    protocol = protocol_from(args)
    workload = load_workload(args.target)
    url = args.storage or f"sqlite:///{(out / 'study.db').resolve()}"
    storage = open_storage(url)
    runner = Runner(workload, args.target, device, protocol, isolate=not args.in_process, timeout_s=timeout)
    agent = Agent(runner, recipes, storage, args.study or _slug(workload.name),
                  Settings(trials, budget, limit, args.seed, only), workload_facts(workload))
    agent.report["study"] = {"storage": redact(url), "name": agent.study}
    code = 0
    with ui.progress() as prog:
        agent.events = Display(prog)
        try:
            agent.run()
        except KeyboardInterrupt:
            agent.report["stop_reason"] = "interrupted (Ctrl-C): the report holds what was measured; rerun the same command to resume"
            code = 130
    report = {**agent.report, "study": {"storage": redact(url), "name": agent.study}}
    if "baseline" not in report:
        ui.console.print("interrupted before the baseline was measured: nothing to report")
        return code
    write_outputs(report, out)
    ui.print_tune_summary(report, out)
    return code
