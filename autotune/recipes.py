"""The recipe ladder: one declarative YAML file per fix family, cheapest first.

A recipe names the bottleneck classes it targets, its cost rank, when it applies, the
knobs it searches (dotted `TrainConfig` keys with their choices) and its trade-offs.
A knob's effect is code in the loop; a recipe is only data, so adding a file adds a fix.
Ranges may adapt to the machine: `max: "4*cores"`, `choices: divisors` (of the batch).
"""

from __future__ import annotations

import ast
import importlib.resources
import math
import operator
import os
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import KEYS
from .diagnose import COMPUTE_STAGES
from .errors import UserError
from .record import Bottleneck

# The shipped recipe files: `recipes/` at the repository's top level, installed inside the
# wheel as the data package `autotune.recipe_files` (see pyproject.toml's package-dir).
SHIPPED_PACKAGE = "autotune.recipe_files"
FACTS = ("conv", "checkpoint_blocks", "distributed", "sdpa")
_NEEDS = {"conv": "a convolutional model", "checkpoint_blocks": "Workload.checkpoint_blocks",
          "distributed": "a distributed workload (Workload.world_size > 1)",
          "sdpa": "a model that calls scaled_dot_product_attention"}
WORKERS = "data.num_workers"
MAX_TRIALS = 10_000  # a recipe's own trial count; --trials bounds the run as a whole


class _DivisionByZero(ValueError):
    pass


def _floordiv(a: int, b: int) -> int:
    if b == 0:
        raise _DivisionByZero
    return a // b


_OPS = {ast.Mult: operator.mul, ast.Div: _floordiv, ast.FloorDiv: _floordiv, ast.Add: operator.add,
        ast.Sub: operator.sub}
_MAX_EXPR = 200  # characters: a range bound is a short formula


def evaluate(expr: Any, names: dict[str, int]) -> int:
    """An int, or a small arithmetic expression over `cores` and `batch` ("4*cores").

    Raises:
        ValueError: Anything else (other names, functions, floats, booleans, a division by
            zero for these `names`), with what is wrong.
    """
    if isinstance(expr, int) and not isinstance(expr, bool):
        return expr
    if not isinstance(expr, str) or len(expr) > _MAX_EXPR:
        raise ValueError(f"unsupported bound {_show(expr)} (use an integer or a formula of integers, cores, "
                         "batch and + - * / in at most 200 characters)")

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unsupported expression {expr!r} (use integers, cores, batch, + - * /)")

    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError):
        raise ValueError(f"unsupported expression {expr!r}: not a formula (use integers, cores, batch, + - * /)") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"unsupported expression {_show(expr)}: nested too deeply") from None
    try:
        return int(ev(tree))
    except _DivisionByZero:
        shown = ", ".join(f"{k}={v}" for k, v in names.items())
        raise ValueError(f"expression {expr!r} divides by zero (with {shown})") from None
    except RecursionError:
        raise ValueError(f"unsupported expression {_show(expr)}: nested too deeply") from None


def _show(value: Any) -> str:
    """A value from a recipe file for a message, cut to a line (reprlib bounds nesting too)."""
    return reprlib.repr(value)


@dataclass(frozen=True)
class Knob:
    key: str
    choices: tuple | str
    max: Any = None
    min: Any = None
    device: str | None = None
    grow: bool = False  # numeric: the range may grow geometrically past its top (see `grown`)
    skip_on: tuple[tuple[str, tuple], ...] = ()  # (device, choices that mean nothing there)
    climb_with: bool = False  # the recipe's numeric lead knob is climbed at each of this knob's values in turn

    def values(self, device: str, cores: int, batch: int) -> list[Any]:
        if self.device and self.device != device:
            return []
        names = {"cores": cores, "batch": batch}
        vals = _divisors(batch) if self.choices == "divisors" else list(self.choices)
        skip = dict(self.skip_on).get(device, ())
        vals = [v for v in vals if v not in skip]
        try:
            lo = evaluate(self.min, names) if self.min is not None else None
            hi = evaluate(self.max, names) if self.max is not None else None
        except ValueError as exc:
            raise UserError(f"recipe knob {self.key!r}: its range cannot be computed on this machine "
                            f"(cores={cores}, batch={batch}): {exc}; fix min/max in the recipe file.") from None
        numeric = [v for v in vals if isinstance(v, int) and not isinstance(v, bool)]
        keep = [v for v in numeric if (lo is None or v >= lo) and (hi is None or v <= hi)]
        return [v for v in vals if v not in numeric or v in keep]


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str
    targets: tuple[Bottleneck, ...]
    cost: int
    devices: tuple[str, ...]
    requires: tuple[str, ...]
    knobs: tuple[Knob, ...]
    trials: int
    tradeoffs: str
    snippet: str = ""
    source: str = ""
    # Priors that only order the ladder (the measurement decides): the fraction of a
    # targeted waste the recipe is expected to remove, and its expected compute speedup.
    removes: float = 0.8
    compute_speedup: float = 1.1
    setup_s: float = 0.0  # seconds each trial spends before its first step beyond an ordinary trial
    # The compute stage `compute_speedup` applies to (e.g. "optimizer": a fused optimizer
    # speeds up the optimizer step only); none: the model's whole compute.
    stage: str | None = None
    each_knob_first: bool = False  # a joint search: measure each knob alone before combining them
    # Its configs are alternatives, most promising first (fused, then foreach): the next is
    # measured only when the ones before could not run (failed, or over the memory limit).
    fallbacks: bool = False
    together: bool = False  # its knobs' single values are one config, measured as one (`plan.stacked_recipe`)

    def applies(self, device: str, facts: dict[str, bool]) -> tuple[bool, str]:
        if device not in self.devices:
            return False, f"only for {', '.join(self.devices)}"
        missing = [r for r in self.requires if not facts.get(r)]
        if missing:
            return False, "needs " + ", ".join(_NEEDS[m] for m in missing)
        if facts.get("repeats_in_workers") and self.moves_loading():
            return False, ("needs a dataset its loader workers split: this IterableDataset yields the same samples in "
                           "each worker, so N workers would train on each sample N times (split its stream with "
                           "torch.utils.data.get_worker_info())")
        return True, ""

    def moves_loading(self) -> bool:
        """Whether it can move the loading out of the training process (loader workers)."""
        return any(k.key == WORKERS for k in self.knobs)

    def space(self, device: str, cores: int, batch: int) -> dict[str, list[Any]]:
        out = {k.key: k.values(device, cores, batch) for k in self.knobs}
        return {k: v for k, v in out.items() if v}


def _divisors(n: int) -> list[int]:
    """The divisors of `n` in order, in O(sqrt n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


_SCALARS = (type(None), bool, int, float, str)
_SAMPLE_MACHINES = ({"cores": 2, "batch": 64}, {"cores": 1, "batch": 1}, {"cores": 64, "batch": 4096})


def _check_choice(key: str, value: Any) -> str | None:
    """Why `value` cannot be the config key's value, or None when it can."""
    from pydantic import ValidationError

    from .config import TrainConfig

    if not isinstance(value, _SCALARS):
        return (f"field 'knobs.{key}.choices' must list plain values (numbers, text, true/false, null), "
                f"got {_show(value)}")
    section, _, name = key.partition(".")
    model = TrainConfig.model_fields[section].annotation
    try:
        model.model_validate({name: value})
    except ValidationError as exc:
        return f"field 'knobs.{key}.choices': {_show(value)} is not a valid {key} ({exc.errors()[0]['msg']})"
    return None


def _parse_knobs(raw: Any, errors: list[str]) -> list[Knob]:
    knobs: list[Knob] = []
    if not isinstance(raw, dict) or not raw:
        errors.append("field 'knobs' must map dotted config keys to {choices: [...]}")
        return knobs
    for key, spec in raw.items():
        if key not in KEYS:
            errors.append(f"field 'knobs.{key}': not a config key (known: {', '.join(KEYS)})")
            continue
        if not isinstance(spec, dict) or "choices" not in spec:
            errors.append(f"field 'knobs.{key}' needs choices: a list of values, or 'divisors'")
            continue
        unknown = [k for k in spec if k not in ("choices", "min", "max", "device", "grow", "skip_on", "climb_with")]
        if unknown:
            errors.append(f"field 'knobs.{key}' has unknown field(s) {', '.join(_show(k) for k in unknown)} "
                          "(known: choices, min, max, device, grow, skip_on, climb_with)")
        ch = spec["choices"]
        if not (ch == "divisors" or (isinstance(ch, list) and ch)):
            errors.append(f"field 'knobs.{key}.choices' must be a non-empty list or 'divisors', got {_show(ch)}")
            continue
        bad = [why for why in (_check_choice(key, v) for v in (ch if isinstance(ch, list) else [])) if why]
        if bad:
            errors += bad[:3]
            continue
        bounds_ok = True
        for bound in ("min", "max"):
            if spec.get(bound) is not None:
                try:
                    for names in _SAMPLE_MACHINES:
                        evaluate(spec[bound], names)
                except ValueError as exc:
                    errors.append(f"field 'knobs.{key}.{bound}': {exc}")
                    bounds_ok = False
        if bounds_ok and spec.get("min") is not None and spec.get("max") is not None:
            low, high = (evaluate(spec[b], _SAMPLE_MACHINES[0]) for b in ("min", "max"))
            if low > high:
                errors.append(f"field 'knobs.{key}': min {_show(spec['min'])} is above max {_show(spec['max'])} "
                              f"({low} > {high} with cores=2, batch=64), so no value is left to try")
        device = spec.get("device")
        if device not in (None, "cpu", "cuda"):
            errors.append(f"field 'knobs.{key}.device' must be cpu or cuda (or left out), got {_show(device)}")
        grow, climb = spec.get("grow", False), spec.get("climb_with", False)
        for field_name, flag in (("grow", grow), ("climb_with", climb)):
            if not isinstance(flag, bool):
                errors.append(f"field 'knobs.{key}.{field_name}' must be true or false, got {_show(flag)}")
        skip_on = spec.get("skip_on") or {}
        if not isinstance(skip_on, dict) or any(d not in ("cpu", "cuda") or not isinstance(v, list)
                                                for d, v in skip_on.items()):
            errors.append(f"field 'knobs.{key}.skip_on' must map cpu and/or cuda to a list of choices, "
                          f"got {_show(skip_on)}")
            skip_on = {}
        knobs.append(Knob(key, tuple(ch) if isinstance(ch, list) else ch, spec.get("max"), spec.get("min"),
                          device, bool(grow), tuple((d, tuple(v)) for d, v in skip_on.items()), climb is True))
    return knobs


def _number(data: dict, key: str, default: float, low: float, high: float, errors: list[str]) -> float:
    v = data.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        errors.append(f"field {key!r} must be a number from {low} to {high}, got {_show(v)}")
        return default
    return float(v)


def _read(path: Any, where: str) -> Any:
    """The parsed YAML of a recipe file, every failure to read it a `UserError`."""
    from .config import load_yaml

    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{where} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8.") from None
    except OSError as exc:
        raise UserError(f"{where} cannot be read ({exc.strerror or exc}); give readable recipe files.") from None
    return load_yaml(text, where)


def _text_field(data: dict, key: str, errors: list[str], required: bool = False) -> str:
    v = data.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str) or (required and not v.strip()):
        errors.append(f"field {key!r} must be {'non-empty ' if required else ''}text, got {_show(v)}")
        return ""
    return v


def _parse(path: Any) -> Recipe:
    where = f"recipe file {str(path)!r}"
    data = _read(path, where)
    if not isinstance(data, dict):
        raise UserError(f"{where} must be a mapping with name, targets, cost, knobs, tradeoffs.")
    errors: list[str] = []
    known = {"name", "summary", "targets", "cost", "applies", "knobs", "trials", "tradeoffs", "snippet", "removes",
             "compute_speedup", "setup_s", "stage", "fallbacks"}
    errors += [f"unknown field {_show(k)} (known: {', '.join(sorted(known))})" for k in data if k not in known]
    errors += [f"missing field {k!r}" for k in ("name", "targets", "cost", "knobs", "tradeoffs") if k not in data]
    name = _text_field(data, "name", errors, required="name" in data)
    summary = _text_field(data, "summary", errors)
    tradeoffs = _text_field(data, "tradeoffs", errors, required="tradeoffs" in data)
    snippet = _text_field(data, "snippet", errors)
    classes = {b.value for b in Bottleneck}
    targets = data.get("targets") or []
    if not isinstance(targets, list) or any(not isinstance(t, str) or t not in classes for t in targets):
        errors.append(f"field 'targets' must be a list of {sorted(classes)}, got {_show(targets)}")
        targets = []
    if "cost" in data and (not isinstance(data["cost"], int) or isinstance(data["cost"], bool) or data["cost"] < 1):
        errors.append(f"field 'cost' must be a positive integer rank, got {_show(data['cost'])}")
    applies = data.get("applies") or {}
    devices = applies.get("devices", ["cpu", "cuda"]) if isinstance(applies, dict) else None
    requires = applies.get("requires", []) if isinstance(applies, dict) else None
    if isinstance(applies, dict) and any(k not in ("devices", "requires") for k in applies):
        errors.append(f"field 'applies' has unknown field(s) {', '.join(_show(k) for k in applies if k not in ('devices', 'requires'))} "
                      "(known: devices, requires)")
    if not isinstance(devices, list) or not devices or any(d not in ("cpu", "cuda") for d in devices):
        errors.append(f"field 'applies.devices' must list cpu and/or cuda, got {_show(devices)}")
    if not isinstance(requires, list) or any(r not in FACTS for r in requires):
        errors.append(f"field 'applies.requires' must list some of {list(FACTS)}, got {_show(requires)}")
    knobs = _parse_knobs(data.get("knobs") or {}, errors)
    trials = data.get("trials", 6)
    if not isinstance(trials, int) or isinstance(trials, bool) or not 1 <= trials <= MAX_TRIALS:
        errors.append(f"field 'trials' must be a whole number from 1 to {MAX_TRIALS}, got {_show(trials)}")
    removes = _number(data, "removes", 0.8, 0.0, 1.0, errors)
    speedup = _number(data, "compute_speedup", 1.1, 1.0, 100.0, errors)
    setup_s = _number(data, "setup_s", 0.0, 0.0, 3600.0, errors)
    stage = data.get("stage")
    if stage is not None and stage not in COMPUTE_STAGES:
        errors.append(f"field 'stage' must be one of {list(COMPUTE_STAGES)}, got {_show(stage)}")
    fallbacks = data.get("fallbacks", False)
    if not isinstance(fallbacks, bool):
        errors.append(f"field 'fallbacks' must be true or false, got {_show(fallbacks)}")
    if errors:
        raise UserError(f"{where} is malformed: " + "; ".join(errors) + ".")
    return Recipe(
        name=name, summary=summary, targets=tuple(Bottleneck(t) for t in targets),
        cost=data["cost"], devices=tuple(devices), requires=tuple(requires), knobs=tuple(knobs), trials=trials,
        tradeoffs=" ".join(tradeoffs.split()), snippet=snippet, source=str(path),
        removes=removes, compute_speedup=speedup, setup_s=setup_s, stage=stage, fallbacks=bool(fallbacks),
    )


def shipped_files() -> list[Any]:
    """The recipe files shipped with autotune, as importlib resources; run from a source
    checkout without installing it (`PYTHONPATH=. python -m autotune`), the checkout's
    `recipes/` folder, which is what the wheel installs as that package."""
    try:
        folder: Any = importlib.resources.files(SHIPPED_PACKAGE)
    except ModuleNotFoundError:
        folder = Path(__file__).resolve().parents[1] / "recipes"
        if not folder.is_dir():
            raise UserError(f"autotune's recipe files are missing (neither the package {SHIPPED_PACKAGE} nor "
                            f"{str(folder)!r} exists); reinstall autotune.") from None
    return sorted((f for f in folder.iterdir() if f.name.endswith((".yaml", ".yml"))), key=lambda f: f.name)


def load_recipes(extra_dir: str | os.PathLike | None = None) -> list[Recipe]:
    """The shipped recipes, with `extra_dir`'s added or overriding by name; cheapest first."""
    by_name: dict[str, Recipe] = {}
    files = shipped_files()
    if extra_dir is not None:
        d = Path(extra_dir)
        if not d.is_dir():
            raise UserError(f"--recipes {str(d)!r} is not a folder; give a folder of recipe .yaml files.")
        files += sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml"))
    for path in files:
        r = _parse(path)
        by_name[r.name] = r
    return sorted(by_name.values(), key=lambda r: (r.cost, r.name))


def select(recipes: list[Recipe], only: str | None) -> tuple[str, ...]:
    """The recipe names of a comma-separated `--only` list, each checked to exist."""
    names = tuple(x.strip() for x in only.split(",") if x.strip()) if only else ()
    unknown = [x for x in names if x not in {r.name for r in recipes}]
    if unknown:
        raise UserError(f"--only names unknown recipe(s) {', '.join(unknown)}; known: {', '.join(r.name for r in recipes)}.")
    return names


def matching(recipes: list[Recipe], bottleneck: Bottleneck, device: str, facts: dict[str, bool]) -> list[Recipe]:
    return [r for r in recipes if bottleneck in r.targets and r.applies(device, facts)[0]]
