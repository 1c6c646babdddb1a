"""What to try next: every recipe that could act on a material waste or on the compute,
ranked by expected gain per second (a prior bounded by the measured shares, over the round's
expected seconds; the measurement decides), the closing recipes once none is left, and why the run stops.

A non-compute waste is worth trials only while removing all of it could clear the noise
(`material`); the compute is worth every recipe that applies. A recipe may be tried again
once, when a later kept change moved the step's time onto its class. A config over the
memory limit gets the memory-saving recipes searched together first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from . import probe
from .handoff import gates
from .config import TrainConfig
from .diagnose import ADVICE, COMPUTE_STAGES, material, resolvable
from .errors import ConfigError
from .leftover import words
from .recipes import Knob, Recipe
from .record import Bottleneck, Leftover, Step, Verdict, Waste

__all__ = ["STACK", "UNDO", "Attempts", "Choice", "closing_recipe", "expected_gain", "inapplicable",
           "joint_memory_recipe", "rank", "round_seconds", "stacked_recipe", "stop_reason", "undo_recipe"]

REVISIT_GROWTH = 1.5  # a target's share must grow this much (and by REVISIT_MIN) to try a recipe again
REVISIT_MIN = 0.05


@dataclass(frozen=True)
class Choice:
    recipe: Recipe
    target: Bottleneck
    expected: float
    score: float


@dataclass
class Attempts:
    """Which recipes were tried, how often, the shares each round left, which fell short inside
    the noise, and how many changes were kept since."""

    shares: dict[str, list[dict[Bottleneck, float]]] = field(default_factory=dict)
    kept: int = 0  # accepted steps so far
    inconclusive: dict[str, int] = field(default_factory=dict)  # recipe -> `kept` when its gain fell short
    near: dict[str, dict[str, Any]] = field(default_factory=dict)  # recipe -> the changes that fell short

    def record(self, recipe: Recipe, verdict: Verdict, step: Step | None = None) -> None:
        self.shares.setdefault(recipe.name, []).append({w.cls: w.share for w in verdict.wastes})
        if step is not None and step.accepted:
            self.kept += 1
        elif step is not None and step.speedup is not None and step.speedup.ratio > 1.0:
            self.inconclusive[recipe.name] = self.kept  # measured faster, not surely: changes interact
            self.near[recipe.name] = {k: v[1] for k, v in (step.changes or {}).items()}

    def times(self, name: str) -> int:
        return len(self.shares.get(name, []))

    def may_try(self, recipe: Recipe, verdict: Verdict) -> bool:
        """Whether `recipe` may be searched: untried, or tried once and either a target's share has
        grown materially since, or its gain fell inside the noise and a change was kept since."""
        past = self.shares.get(recipe.name)
        if not past:
            return True
        if len(past) > 1:
            return False
        return self.kept > self.inconclusive.get(recipe.name, self.kept) or self._grown(recipe, verdict)

    def near_miss(self, recipe: Recipe, verdict: Verdict) -> dict[str, Any] | None:
        """The changes of a near-miss to measure again from the current config (its gain fell inside
        the noise, a change was kept since, no target's share grew); None for any other revisit."""
        if self.times(recipe.name) != 1 or self._grown(recipe, verdict) or \
                not self.kept > self.inconclusive.get(recipe.name, self.kept):
            return None
        return self.near.get(recipe.name) or None

    def _grown(self, recipe: Recipe, verdict: Verdict) -> bool:
        """Whether a target's share has grown materially from what the recipe's round left."""
        past = self.shares.get(recipe.name) or [{}]
        for w in verdict.wastes:
            before = past[0].get(w.cls, 0.0)
            if w.cls in recipe.targets and w.cls is not Bottleneck.COMPUTE and \
                    w.share >= REVISIT_GROWTH * before and w.share >= before + REVISIT_MIN:
                return True
        return False


def expected_gain(recipe: Recipe, waste: Waste, stages: dict[str, float] | None = None,
                  lowp: dict[str, float] | None = None, handoff: float | None = None) -> float:
    """The prior gain of `recipe` on one waste, bounded by its measured share (Amdahl; a one-stage
    recipe by that stage's share in `stages`); autocast's speedup from the `lowp` probe, and a
    loader's gain from the wait beyond the `handoff` share, where measured."""
    if waste.cls is Bottleneck.COMPUTE:
        share = waste.share
        if recipe.stage is not None:
            share = (stages or {}).get(recipe.stage, share)
        speedup = recipe.compute_speedup
        if lowp and any(k.key == probe.KEY for k in recipe.knobs):
            speedup = probe.amp_prior(lowp, speedup)
        return 1.0 / (1.0 - share * (1.0 - 1.0 / speedup))
    if waste.cls is Bottleneck.MEMORY:
        return math.inf if waste.share >= 1.0 else 1.0  # not fitting outranks any speed
    share = waste.share
    if waste.cls is Bottleneck.INPUT and handoff is not None and recipe.moves_loading():
        share = max(0.0, share - handoff)
    if waste.cls is Bottleneck.LAUNCH and recipe.stage is not None and stages:
        # The dispatch inside its stage, spread over the model's stages by their time: a fused
        # optimizer removes the optimizer's per-parameter ops, not the forward's.
        work = sum(stages.get(s, 0.0) for s in COMPUTE_STAGES)
        share *= min(1.0, stages.get(recipe.stage, 0.0) / work) if work > 0 else 1.0
    return 1.0 / max(1e-9, 1.0 - recipe.removes * share)


def round_seconds(recipe: Recipe, trial_s: float) -> float:
    """What a recipe's round is expected to cost: its trials, each an ordinary trial of
    `trial_s` plus the recipe's set-up (compilation, for one)."""
    return recipe.trials * (trial_s + recipe.setup_s)


def rank(recipes: list[Recipe], verdict: Verdict, device: str, facts: dict[str, bool], attempts: Attempts,
         margin: float, only: tuple[str, ...] = (), lowp: dict[str, float] | None = None,
         handoff: float | None = None, trial_s: float | None = None) -> list[Choice]:
    """Every recipe worth a search now, the highest expected gain per second first: the log of
    the prior gain over `round_seconds` (`trial_s`: this run's trial time, else one second;
    `lowp` and `handoff` as in `expected_gain`)."""
    out = []
    for r in recipes:
        if (only and r.name not in only) or not r.applies(device, facts)[0] or not attempts.may_try(r, verdict):
            continue
        best: Choice | None = None
        for w in verdict.wastes:
            if w.cls not in r.targets or not (material(w, margin) or w.cls is Bottleneck.COMPUTE):
                continue
            g = expected_gain(r, w, verdict.evidence.get("stage_shares"), lowp, handoff)
            if g <= 1.0 or (r.moves_loading() and gates(w, handoff, margin)):
                continue  # the prior says it does nothing to this waste (or too little to resolve)
            score = math.inf if math.isinf(g) else math.log(g) / round_seconds(r, trial_s or 1.0)
            if best is None or score > best.score:
                best = Choice(r, w.cls, g, score)
        if best is not None:
            out.append(best)
    return sorted(out, key=lambda c: (-c.score, c.recipe.cost, c.recipe.name))


def inapplicable(recipes: list[Recipe], verdict: Verdict, device: str, facts: dict[str, bool], margin: float) -> str:
    """Why recipes for a material non-compute waste do not apply to this workload, as a clause
    ("" where none is left out so; recipes for another device are not named)."""
    wastes = {w.cls for w in verdict.wastes if w.cls is not Bottleneck.COMPUTE and material(w, margin)}
    out = []
    for r in recipes:
        ok, why = r.applies(device, facts)
        if not ok and device in r.devices and wastes & set(r.targets):
            out.append(f"{r.name} does not apply: it {why}")
    return "; ".join(out)


def joint_memory_recipe(choices: list[Choice]) -> Recipe | None:
    """The memory-saving recipes among `choices` as one search, when the config does not fit."""
    parts = [c.recipe for c in choices if c.target is Bottleneck.MEMORY and math.isinf(c.expected)]
    if len(parts) < 2:
        return None
    knobs: dict[str, Knob] = {}
    for r in parts:
        for k in r.knobs:
            knobs.setdefault(k.key, k)
    return Recipe(
        name="memory-joint", summary="the memory-saving knobs searched together: " + ", ".join(r.name for r in parts),
        targets=(Bottleneck.MEMORY,), cost=min(r.cost for r in parts), devices=("cpu", "cuda"), requires=(),
        knobs=tuple(knobs.values()), trials=min(24, sum(r.trials for r in parts) + 4),
        tradeoffs=" ".join(r.tradeoffs for r in parts), snippet="\n".join(r.snippet for r in parts if r.snippet),
        source="joint search of " + ", ".join(r.source for r in parts), each_knob_first=True,
    )


STACK = "stack"


def stacked_recipe(steps: list[Step], config: TrainConfig, recipes: dict[str, Recipe],
                   margin: float) -> Recipe | None:
    """The near-misses (each recipe's latest rejected step that read within the margin of no change
    or better, its interval past the margin) stacked into one config, most gain first; a lone one
    only where a change was kept after its round; None where none is left."""
    latest: dict[str, Step] = {}
    for st in steps:
        if st.recipe != STACK:
            latest[st.recipe] = st
    ups = sorted((st for st in latest.values() if not st.accepted and st.changes and st.speedup is not None
                  and st.speedup.ratio is not None and st.speedup.ratio > 1.0 / margin
                  and st.speedup.high is not None and st.speedup.high > margin), key=lambda st: -st.speedup.ratio)
    changes: dict[str, Any] = {}
    parts: list[Step] = []
    for st in ups:
        extra = {k: v[1] for k, v in st.changes.items() if k not in changes and config.get(k) != v[1]}
        if not extra:
            continue
        try:
            config.with_changes({**changes, **extra})
        except ConfigError:
            continue  # does not combine with the parts before it
        changes.update(extra)
        parts.append(st)
    if not parts or (len(parts) < 2 and not any(st.accepted for st in steps if st.round > parts[0].round)):
        return None  # one part alone was decided already, against the config it would change now
    used = [recipes[st.recipe] for st in parts if st.recipe in recipes]
    each = ", ".join(f"{st.recipe} ({st.speedup.ratio:.2f}x)" for st in parts)
    return Recipe(
        name=STACK, summary=("the near-misses stacked: " + each) if len(parts) > 1 else
        f"a near-miss measured again after a later change was kept: {each}",
        targets=tuple(Bottleneck), cost=0, devices=("cpu", "cuda"), requires=(),
        knobs=tuple(Knob(k, (v,)) for k, v in changes.items()), trials=1,
        tradeoffs=" ".join(r.tradeoffs for r in used), snippet="\n".join(r.snippet for r in used if r.snippet),
        source="stack of " + ", ".join(st.recipe for st in parts),
        compute_speedup=math.prod(st.speedup.ratio for st in parts), together=True,
    )


UNDO = "undo-"  # the name of a recipe that undoes a kept one: "undo-threads"


def undo_recipe(steps: list[Step], config: TrainConfig, done: set[str]) -> Recipe | None:
    """The earliest change kept before another kept change, undone, as a candidate of one config
    (later changes may have turned its gain into a loss); None once an undo was rejected or none is
    left. Changes kept to fit the memory limit are not undone."""
    if any(st.recipe.startswith(UNDO) and not st.accepted for st in steps):
        return None
    kept = [st for st in steps if st.accepted and st.changes and st.bottleneck is not Bottleneck.MEMORY]
    for st in kept[:-1]:
        name = UNDO + st.recipe
        back = {k: v[0] for k, v in st.changes.items() if config.get(k) == v[1]}
        if name in done or not back or st.recipe.startswith(UNDO):
            continue
        try:
            config.with_changes(back)
        except ConfigError:
            continue  # a later change needs it
        gain = st.speedup.ratio if st.speedup and st.speedup.ratio else 1.0
        return Recipe(
            name=name, summary=f"{st.recipe} (kept in round {st.round} at {gain:.2f}x) undone in the final config: "
            "the changes kept after it may have turned its gain into a loss",
            targets=tuple(Bottleneck), cost=0, devices=("cpu", "cuda"), requires=(),
            knobs=tuple(Knob(k, (v,)) for k, v in back.items()), trials=1, tradeoffs="", source=f"undo of {st.recipe}",
            compute_speedup=1.0, together=True)
    return None


def closing_recipe(steps: list[Step], config: TrainConfig, recipes: dict[str, Recipe], margin: float,
                   done: set[str]) -> Recipe | None:
    """Once every recipe was tried: the near-misses stacked (once), then each earlier kept
    change undone (once each); None when neither is left (`done`: the names played)."""
    stack = None if STACK in done else stacked_recipe(steps, config, recipes, margin)
    return stack or undo_recipe(steps, config, done)


def stop_reason(verdict: Verdict, margin: float, lowp: dict[str, float] | None = None, why_not: str = "",
                left: Leftover | None = None) -> str:
    """Why no recipe is worth trying: what is left, in numbers, or where a waste is left, `left`'s
    words (`leftover.words`); without `left`, the waste, `why_not` and any fix that is code."""
    rest = [w for w in verdict.wastes if w.cls is not Bottleneck.COMPUTE]
    if not rest or not any(material(w, margin) for w in rest):
        what = "; ".join(f"{w.cls.value} {w.share:.0%} (at most {w.max_gain:.2f}x)" for w in rest if w.max_gain)
        below = f" (what is left: {what}, not above {resolvable(margin):.3f}: what the noise can resolve)" if what else ""
        slow = "" if not lowp or probe.fast(lowp) else (
            " (autocast does not apply for speed here: this CPU's lower-precision matmuls run at "
            + probe.text(lowp) + " of fp32's)")
        return (f"the slowest stage is acceptable: the step is compute-bound{below}, and every compute recipe that "
                f"applies was tried{slow}")
    if left is not None:
        return words(left)
    top = next(w for w in rest if material(w, margin))
    advice = ADVICE.get(top.cls)
    why = f"; {why_not}" if why_not and top.cls is Bottleneck.INPUT else ""
    what = "bottleneck" if top.cls is verdict.bottleneck else "waste"  # the model's own work may be larger
    return (f"no recipe left for the {top.cls.value} {what} ({top.reason}){why}"
            + (f"; in your code: {advice}" if advice else ""))
