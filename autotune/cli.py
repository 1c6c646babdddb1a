"""The `autotune` command line: an explicit table of commands, one function each."""

from __future__ import annotations

import argparse
import sys

from .errors import UserCodeError, UserError

EXAMPLES = {
    "profile": "examples:\n  autotune profile examples/input_bound.py\n  autotune profile examples/memory_bound.py --memory-limit 64MB --json profile.json --trace trace.json",
    "tune": "examples:\n  autotune tune examples/input_bound.py --out runs/input\n  autotune tune my_train.py:build --trials 30 --budget 20m --storage sqlite:///study.db",
    "train": "examples:\n  autotune train examples/input_bound.py --config runs/input/tuned.yaml --steps 200",
    "recipes": "examples:\n  autotune recipes\n  autotune recipes --recipes my_recipes/",
    "report": "examples:\n  autotune report runs/input",
}


def _profile(args) -> int:
    from .commands import profile

    return profile(args)


def _tune(args) -> int:
    from .commands import tune

    return tune(args)


def _train(args) -> int:
    from .commands import train

    return train(args)


def _recipes(args) -> int:
    from .commands import recipes

    return recipes(args)


def _report(args) -> int:
    from .commands import report

    return report(args)


_COMMANDS = {
    "profile": (_profile, "measure and diagnose a training step; changes nothing"),
    "tune": (_tune, "the whole loop: diagnose, search fixes, keep what measurably helps"),
    "train": (_train, "train with a config through the very loop that was measured"),
    "recipes": (_recipes, "the recipe ladder, cheapest first, with what each targets"),
    "report": (_report, "render the reports again from a tune output folder"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autotune", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    cmds = {}
    for name, (_, help_text) in _COMMANDS.items():
        cmds[name] = sub.add_parser(name, help=help_text, description=help_text, epilog=EXAMPLES[name],
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("profile", "tune", "train"):
        c = cmds[name]
        c.add_argument("target", help="file.py, file.py:func or package.module:func returning autotune.Workload")
        c.add_argument("--device", default="auto", help="auto, cpu or cuda (default auto)")
    for name in ("profile", "tune"):
        c = cmds[name]
        c.add_argument("--memory-limit", help="peak memory allowed, like 512MB or 2GiB")
        c.add_argument("--seed", type=int, default=0, help="model init and data order (default 0)")
        c.add_argument("--windows", type=int, help="measured windows per config (default 5)")
        c.add_argument("--steps", type=int, help="measured steps per window, at least (default 12)")
        c.add_argument("--warmup", type=int, help="warm-up steps per window (default 3)")
    cmds["profile"].add_argument("--json", help="write the measurement and diagnosis as JSON to FILE")
    cmds["profile"].add_argument("--trace", help="write a Chrome/Perfetto trace of the profiled steps to FILE")
    t = cmds["tune"]
    t.add_argument("--trials", type=int, default=40, help="most trials over all recipes (default 40)")
    t.add_argument("--budget", help="wall-clock budget, like 10m or 1h (default none)")
    t.add_argument("--out", default="autotune-out", help="output folder (default autotune-out)")
    t.add_argument("--storage", help="Optuna storage URL (default: sqlite file in --out)")
    t.add_argument("--study", help="study name (default: derived from the workload name)")
    t.add_argument("--recipes", help="folder of extra or overriding recipe files")
    t.add_argument("--only", help="comma-separated recipe names to consider (default all)")
    t.add_argument("--in-process", action="store_true", help="run trials in this process (faster, no crash isolation)")
    t.add_argument("--trial-timeout", default="10m", help="a trial taking longer fails as hung (default 10m)")
    r = cmds["train"]
    r.add_argument("--config", required=True, help="a tuned.yaml written by autotune tune")
    r.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    r.add_argument("--seed", type=int, default=0)
    cmds["recipes"].add_argument("--recipes", help="folder of extra or overriding recipe files")
    cmds["report"].add_argument("dir", help="a tune output folder")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command][0](args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except UserCodeError as exc:
        print(exc.user_traceback(), file=sys.stderr)
        print(f"error: {exc} (this is an error in your workload code, see the traceback above)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
