"""The recipe ladder: one declarative YAML file per fix family, cheapest first.

A recipe names the bottleneck classes it targets, its cost rank, when it applies, the
knobs it searches (dotted `TrainConfig` keys with their choices) and its trade-offs.
A knob's effect is code in the loop; a recipe is only data, so adding a file adds a fix.
Ranges may adapt to the machine: `max: "4*cores"`, `choices: divisors` (of the batch).
"""

from __future__ import annotations

import ast
import importlib.resources
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .config import KEYS
from .errors import UserError
from .record import Bottleneck

# The shipped recipe files: `recipes/` at the repository's top level, installed inside the
# wheel as the data package `autotune.recipe_files` (see pyproject.toml's package-dir).
SHIPPED_PACKAGE = "autotune.recipe_files"
FACTS = ("conv", "checkpoint_blocks")
_OPS = {ast.Mult: operator.mul, ast.Div: operator.floordiv, ast.FloorDiv: operator.floordiv,
        ast.Add: operator.add, ast.Sub: operator.sub}


def evaluate(expr: Any, names: dict[str, int]) -> int:
    """An int, or a small arithmetic expression over `cores` and `batch` ("4*cores")."""
    if isinstance(expr, int):
        return expr

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unsupported expression {expr!r} (use integers, cores, batch, + - * /)")

    return int(ev(ast.parse(str(expr), mode="eval")))


@dataclass(frozen=True)
class Knob:
    key: str
    choices: tuple | str
    max: Any = None
    min: Any = None
    device: str | None = None
    grow: bool = False  # numeric: the range may grow geometrically past its top (see `grown`)

    def values(self, device: str, cores: int, batch: int) -> list[Any]:
        if self.device and self.device != device:
            return []
        names = {"cores": cores, "batch": batch}
        vals = [d for d in range(1, batch + 1) if batch % d == 0] if self.choices == "divisors" else list(self.choices)
        lo = evaluate(self.min, names) if self.min is not None else None
        hi = evaluate(self.max, names) if self.max is not None else None
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
    each_knob_first: bool = False  # a joint search: measure each knob alone before combining them

    def applies(self, device: str, facts: dict[str, bool]) -> tuple[bool, str]:
        if device not in self.devices:
            return False, f"only for {', '.join(self.devices)}"
        missing = [r for r in self.requires if not facts.get(r)]
        if missing:
            return False, "needs " + ", ".join({"conv": "a convolutional model", "checkpoint_blocks": "Workload.checkpoint_blocks"}[m] for m in missing)
        return True, ""

    def space(self, device: str, cores: int, batch: int) -> dict[str, list[Any]]:
        out = {k.key: k.values(device, cores, batch) for k in self.knobs}
        return {k: v for k, v in out.items() if v}


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
        ch = spec["choices"]
        if not (ch == "divisors" or (isinstance(ch, list) and ch)):
            errors.append(f"field 'knobs.{key}.choices' must be a non-empty list or 'divisors', got {ch!r}")
            continue
        for bound in ("min", "max"):
            if spec.get(bound) is not None:
                try:
                    evaluate(spec[bound], {"cores": 2, "batch": 64})
                except (ValueError, SyntaxError) as exc:
                    errors.append(f"field 'knobs.{key}.{bound}': {exc}")
        grow = spec.get("grow", False)
        if not isinstance(grow, bool):
            errors.append(f"field 'knobs.{key}.grow' must be true or false, got {grow!r}")
        knobs.append(Knob(key, tuple(ch) if isinstance(ch, list) else ch, spec.get("max"), spec.get("min"),
                          spec.get("device"), bool(grow)))
    return knobs


def _number(data: dict, key: str, default: float, low: float, high: float, errors: list[str]) -> float:
    v = data.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        errors.append(f"field {key!r} must be a number from {low} to {high}, got {v!r}")
        return default
    return float(v)


def _parse(path: Any) -> Recipe:
    where = f"recipe file {str(path)!r}"
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"{where} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{where} must be a mapping with name, targets, cost, knobs, tradeoffs.")
    errors: list[str] = []
    known = {"name", "summary", "targets", "cost", "applies", "knobs", "trials", "tradeoffs", "snippet", "removes",
             "compute_speedup"}
    errors += [f"unknown field {k!r} (known: {', '.join(sorted(known))})" for k in data if k not in known]
    errors += [f"missing field {k!r}" for k in ("name", "targets", "cost", "knobs", "tradeoffs") if k not in data]
    classes = {b.value for b in Bottleneck}
    targets = data.get("targets") or []
    if not isinstance(targets, list) or any(t not in classes for t in targets):
        errors.append(f"field 'targets' must be a list of {sorted(classes)}, got {targets!r}")
    if "cost" in data and (not isinstance(data["cost"], int) or isinstance(data["cost"], bool) or data["cost"] < 1):
        errors.append(f"field 'cost' must be a positive integer rank, got {data['cost']!r}")
    applies = data.get("applies") or {}
    devices = applies.get("devices", ["cpu", "cuda"]) if isinstance(applies, dict) else None
    requires = applies.get("requires", []) if isinstance(applies, dict) else None
    if not isinstance(devices, list) or any(d not in ("cpu", "cuda") for d in devices):
        errors.append(f"field 'applies.devices' must list cpu and/or cuda, got {devices!r}")
    if not isinstance(requires, list) or any(r not in FACTS for r in requires):
        errors.append(f"field 'applies.requires' must list some of {list(FACTS)}, got {requires!r}")
    knobs = _parse_knobs(data.get("knobs") or {}, errors)
    trials = data.get("trials", 6)
    if not isinstance(trials, int) or trials < 1:
        errors.append(f"field 'trials' must be a positive integer, got {trials!r}")
    removes = _number(data, "removes", 0.8, 0.0, 1.0, errors)
    speedup = _number(data, "compute_speedup", 1.1, 1.0, 100.0, errors)
    if errors:
        raise UserError(f"{where} is malformed: " + "; ".join(errors) + ".")
    return Recipe(
        name=str(data["name"]), summary=str(data.get("summary", "")), targets=tuple(Bottleneck(t) for t in targets),
        cost=data["cost"], devices=tuple(devices), requires=tuple(requires), knobs=tuple(knobs), trials=trials,
        tradeoffs=" ".join(str(data["tradeoffs"]).split()), snippet=str(data.get("snippet", "")), source=str(path),
        removes=removes, compute_speedup=speedup,
    )


def shipped_files() -> list[Any]:
    """The recipe files shipped with autotune, as importlib resources."""
    folder = importlib.resources.files(SHIPPED_PACKAGE)
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
