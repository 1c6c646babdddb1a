"""What to try next: every recipe that could act on a material waste or on the compute,
ranked by expected gain per cost, across the whole verdict rather than its top label.

A recipe's expected gain is a prior (the recipe file's `removes` and `compute_speedup`)
bounded by the measured shares (Amdahl); it only orders the ladder, the measurement
decides. What gates a recipe is the waste it targets: a non-compute waste is worth trials
only while removing all of it could clear the noise (its Amdahl bound, `material`); the
compute is always worth the recipes that apply, since no prior says what they gain on this
machine (a prior's best case below the noise margin is still measured). A recipe
may be tried again once, when a later accepted change has moved the step's time onto the
class it targets. When the config does not fit the memory limit, the memory-saving
recipes are searched together first (precision, micro-batch, checkpointing), since any
one alone may not fit while a pair does.
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
from .recipes import Knob, Recipe
from .record import Bottleneck, Step, Verdict, Waste

__all__ = ["STACK", "UNDO", "Attempts", "Choice", "closing_recipe", "expected_gain", "inapplicable",
           "joint_memory_recipe", "rank", "stacked_recipe", "stop_reason", "undo_recipe"]

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
    """Which recipes were tried, how often, and the shares of their targets each round left;
    which were rejected with a gain inside the noise, and how many changes were kept since."""

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
        """Untried, or tried once and either a target's share has since grown materially from
        what that round left (a later change moved the step's time back onto it), or its gain
        fell inside the noise and a change was kept since (fewer threads may pay only once
        compile and a fused optimizer have removed the larger costs)."""
        past = self.shares.get(recipe.name)
        if not past:
            return True
        if len(past) > 1:
            return False
        return self.kept > self.inconclusive.get(recipe.name, self.kept) or self._grown(recipe, verdict)

    def near_miss(self, recipe: Recipe, verdict: Verdict) -> dict[str, Any] | None:
        """The changes a revisit is for, when it is for a near-miss alone (its gain fell
        inside the noise and a change was kept since, and no target's share has grown):
        what `rounds.play` measures again from the current config instead of a new search."""
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
    """The prior gain of `recipe` on one waste, bounded by the waste's measured share (for
    a recipe that acts on one compute stage, that stage's share in `stages`, and of a
    dispatch-bound step's launch cost the part inside that stage: Amdahl). A
    recipe that searches autocast's precision takes its compute speedup from the probe of
    this machine's matmuls (`lowp`, `autotune.probe`) where there is one. A recipe that
    moves loading into workers leaves the step receiving its batches from them
    (`handoff`: that share of the step, where the step loads in its own process and it
    was measured, `autotune.handoff`): it can remove only the wait beyond that."""
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


def rank(recipes: list[Recipe], verdict: Verdict, device: str, facts: dict[str, bool], attempts: Attempts,
         margin: float, only: tuple[str, ...] = (), lowp: dict[str, float] | None = None,
         handoff: float | None = None) -> list[Choice]:
    """Every recipe worth a search now, best expected gain per cost first (`lowp`: the
    low-precision probe, which can say that autocast cannot speed up this machine;
    `handoff`: the share of the step receiving its batches from workers would cost, which
    can say that workers cannot shorten its data wait)."""
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
            score = math.inf if math.isinf(g) else math.log(g) / max(r.cost, 1)
            if best is None or score > best.score:
                best = Choice(r, w.cls, g, score)
        if best is not None:
            out.append(best)
    return sorted(out, key=lambda c: (-c.score, c.recipe.cost, c.recipe.name))


def inapplicable(recipes: list[Recipe], verdict: Verdict, device: str, facts: dict[str, bool], margin: float) -> str:
    """Why recipes for a material waste other than compute are not searched on this workload
    (they need something it lacks), as a clause; "" where none is left out so. A recipe for
    another device is not named: its waste is not measured here."""
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
    """The changes that side by side were neither shown nor ruled out, stacked into one
    candidate: the latest rejected step of each recipe whose comparison read within the
    margin of no change or better and whose interval reaches past the margin, most gain
    first, each key from the first that sets it, keeping what fits together.

    Gains of 2-7% apiece sit inside this machine's between-session noise and are rejected
    one by one, though together they are one clear change: resnet_jpeg's grid's best is 1
    thread, channels_last, foreach and bf16 together, 1.14x the default, and no part alone
    cleared the margin; overhead_bound's 1 thread (1.18x over 30 pairs) and compile (which
    helps only with it) were each rejected. An engineer stacks the near-misses and measures
    the stack; so does this, once, as a recipe of one config, under the same decision.
    A part may read just under 1: transformer_encoder's bf16 read 0.99x [0.89, 1.11] and
    fused AdamW 1.05x [0.91, 1.20], and the judge read bf16 alone 1.01x, the two together
    1.15x (the grid's best); the stored runs before would have stacked overhead_bound's
    compile (0.99x) with its 1 thread (1.04x) the same way, its grid's best.

    One near-miss alone is measured again only where a change was kept after its round: its
    comparison was against a config that is gone. overhead_bound's 1 thread read 1.00x
    [0.93, 1.07] before compile was kept, and the run stopped at 0.80 of its grid's best (1
    thread with compile; s20); in s19c, 1 thread read 1.14x there, was revisited after
    compile (`Attempts.may_try`: it had pointed up) and was kept at 1.25x."""
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
    """The earliest change kept before another kept change, undone, as a recipe of one
    config (None when there is none left to try).

    A kept change was measured against the config of its round; each change kept after it
    alters the code it runs beside, and can turn its gain into a loss. gpt (s35, Zen 4):
    one intra-op thread read 1.20x [1.14, 1.27] over 3 looks on the eager default and was
    kept; the fused AdamW and compile kept after it each run their kernels wide, and the
    judge read the final config 0.84 of the same without the thread limit (the stored grid:
    fused at the default threads 2,052 samples/s, with one thread 1,589). An engineer checks
    each earlier fix again in the final config; so does this, one undo each, oldest first
    (its comparison is the most out of date), under the same decision as any candidate,
    and goes on to the next only while undoes are kept: an undo rejected says the oldest
    change held in the final config, and the younger ones were measured against configs
    closer to it (a trial each would cost overhead_bound, with three kept changes, 7 of its
    grid's 24 where 5 found its best). Changes kept to fit the memory limit are not undone
    (the config would not fit)."""
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
            continue  # a later change needs it (workers that a later persistent_workers relies on)
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


def stop_reason(verdict: Verdict, margin: float, lowp: dict[str, float] | None = None, why_not: str = "") -> str:
    """Why no recipe is worth trying: what is left, in numbers, and any fix that is code
    (`why_not`: why the input waste's recipes were not worth it, where a probe said so)."""
    left = [w for w in verdict.wastes if w.cls is not Bottleneck.COMPUTE]
    if not left or not any(material(w, margin) for w in left):
        rest = "; ".join(f"{w.cls.value} {w.share:.0%} (at most {w.max_gain:.2f}x)" for w in left if w.max_gain)
        below = f" (what is left: {rest}, not above {resolvable(margin):.3f}: what the noise can resolve)" if rest else ""
        slow = "" if not lowp or probe.fast(lowp) else (
            " (autocast does not apply for speed here: this CPU's lower-precision matmuls run at "
            + probe.text(lowp) + " of fp32's)")
        return (f"the slowest stage is acceptable: the step is compute-bound{below}, and every compute recipe that "
                f"applies was tried{slow}")
    top = next(w for w in left if material(w, margin))
    advice = ADVICE.get(top.cls)
    why = f"; {why_not}" if why_not and top.cls is Bottleneck.INPUT else ""
    return (f"no recipe left for the {top.cls.value} bottleneck ({top.reason}){why}"
            + (f"; in your code: {advice}" if advice else ""))
