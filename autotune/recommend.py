"""The recommendations of a run: one per recipe round that produced a candidate, ranked,
with what it costs (memory, one-time time) and the code that applies it."""

from __future__ import annotations

from typing import Any

from .plan import UNDO
from .recipes import Recipe
from .record import Recommendation, Step

__all__ = ["recommendations", "render_snippet"]


def recommendations(steps: list[Step], recipes: dict[str, Recipe]) -> list[Recommendation]:
    """One per recipe round, ranked: accepted by gain, then the others (`tried` false where
    the round measured no config); a kept change that a later round undid
    (`plan.undo_recipe`) is not kept."""
    undone = {st.recipe[len(UNDO):]: st for st in steps if st.accepted and st.recipe.startswith(UNDO)}
    out = []
    for st in steps:
        sp, later = st.speedup, undone.get(st.recipe)
        kept = st.accepted and (later is None or later.round < st.round)
        rec = Recommendation(recipe=st.recipe, changes=st.changes, speedup=sp.ratio if sp else None,
                             ci=[sp.low, sp.high] if sp else [None, None], accepted=kept, tried=bool(st.trials),
                             reason=None if kept else st.reason if not st.accepted else
                             f"kept in round {st.round}, then undone in round {later.round}: {later.reason}")
        before, after = st.before, st.after
        if after:
            if after.peak_memory_bytes is not None and before.peak_memory_bytes is not None:
                rec.memory_delta_bytes = after.peak_memory_bytes - before.peak_memory_bytes
            extra = after.one_time_s - before.one_time_s
            rec.one_time_s = extra
            saved = (before.step_time_s or 0) - (after.step_time_s or 0)
            rec.payoff_steps = (0 if extra <= 0 else int(extra / saved) + 1) if saved > 0 else None
        recipe = recipes.get(st.recipe)
        if recipe and recipe.snippet and st.changes:
            rec.snippet = render_snippet(recipe.snippet, st.after_config or {})
        out.append(rec)
    return sorted(out, key=lambda x: (not x.accepted, -(x.speedup or 0)))


def render_snippet(template: str, config: dict[str, Any]) -> str:
    """The recipe's snippet with `{dotted.key}` filled from the config it recommends; a line naming
    a key the config leaves unset (null: PyTorch's own value) is left out."""
    lines = []
    for line in template.splitlines():
        if any(value is None and "{" + key + "}" in line for key, value in config.items()):
            continue
        for key, value in config.items():
            line = line.replace("{" + key + "}", str(value))
        lines.append(line)
    return "\n".join(lines) + ("\n" if template.endswith("\n") else "")

