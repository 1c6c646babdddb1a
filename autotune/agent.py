"""The tuning loop: baseline, A/A noise, diagnose, search the cheapest matching recipe,
accept only what clears the noise in an interleaved re-measurement, repeat.

Decisions live in Optuna storage beside the trials (study user attributes), so re-running
the same command resumes: nothing finished is measured again.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna
import torch

from . import __version__
from .config import TrainConfig
from .diagnose import ADVICE, acceptable, diagnose
from .recipes import Recipe, matching
from .errors import UserError
from .runner import Runner, TrialFailed
from .search import Constraints, RecipeSearch, trial_record
from .stats import noise_margin, paired_ratio

MIN_GAIN = 0.03  # a change must gain at least 3%, whatever the noise says


@dataclass
class Settings:
    trials: int = 40
    budget_s: float | None = None
    memory_limit: int | None = None
    seed: int = 0
    only: tuple[str, ...] = ()


@dataclass
class State:
    config: TrainConfig
    summary: dict[str, Any]
    verdict: Any
    feasible: bool


@dataclass
class Agent:
    runner: Runner
    recipes: list[Recipe]
    storage: Any
    study: str
    settings: Settings
    facts: dict[str, bool]
    events: Callable[[str, dict], None] = lambda kind, info: None
    report: dict[str, Any] = field(default_factory=dict)

    # --- stored decisions --------------------------------------------------------------
    def _ledger(self) -> optuna.Study:
        return optuna.create_study(study_name=self.study, storage=self.storage, load_if_exists=True)

    def _remember(self, key: str, compute: Callable[[], Any]) -> Any:
        ledger = self._ledger()
        if key in ledger.user_attrs:
            return ledger.user_attrs[key]
        value = compute()
        ledger.set_user_attr(key, value)
        return value

    def _compare(self, key: str, a: TrainConfig, b: TrainConfig, what: str) -> dict[str, Any]:
        """B over A from windows taken in turns; `failed` says why when one could not run."""

        def run():
            self.events("compare", {"what": what, "pairs": self.runner.protocol.windows})
            try:
                xs, ys = self.runner.interleave(a, b, self.runner.protocol.windows)
            except TrialFailed as exc:
                return {"ratio": None, "low": None, "high": None, "pairs": 0, "failed": f"{exc.kind}: {exc.reason}"}
            return {**paired_ratio(xs, ys), "a": xs, "b": ys}

        return self._remember(key, run)

    # --- the loop ------------------------------------------------------------------------
    def _feasible(self, summary: dict[str, Any]) -> bool:
        lim = self.settings.memory_limit
        return not (lim and (summary.get("peak_memory_bytes") or 0) > lim)

    def _state(self, config: TrainConfig, summary: dict[str, Any]) -> State:
        v = diagnose(summary, self.runner.device.type, self.settings.memory_limit)
        return State(config, summary, v, self._feasible(summary))

    def run(self) -> dict[str, Any]:
        t_start = time.time()
        deadline = t_start + self.settings.budget_s if self.settings.budget_s else None
        r = self.report
        r.update(self._header())
        self.events("phase", {"name": "baseline"})
        base_cfg = TrainConfig()
        base = self._remember("baseline", lambda: self._baseline(base_cfg))
        state = self._state(base_cfg, base)
        r["baseline"], r["initial_diagnosis"] = base, state.verdict.to_dict()
        r["final"], r["diagnosis"] = base, state.verdict.to_dict()
        self.events("phase", {"name": "A/A noise"})
        aa = self._compare("noise", base_cfg, base_cfg, "baseline against itself")
        if aa.get("failed"):
            raise UserError(f"the baseline could not be measured twice side by side ({aa['failed']}).")
        margin = noise_margin(aa, MIN_GAIN)
        r["noise"] = {**{k: aa[k] for k in ("ratio", "low", "high", "pairs")}, "margin": margin, "min_gain": MIN_GAIN}
        r["steps"], used, ran_now, tried = [], 0, 0, set()
        r["final_config"] = base_cfg.model_dump()
        r["stop_reason"] = None
        round_no = 0
        while r["stop_reason"] is None:
            todo = [x for x in matching(self.recipes, state.verdict.bottleneck, self.runner.device.type, self.facts)
                    if x.name not in tried and (not self.settings.only or x.name in self.settings.only)]
            if not todo:
                r["stop_reason"] = self._why_stop(state)
                break
            if used >= self.settings.trials:
                r["stop_reason"] = f"trial budget spent ({used} of {self.settings.trials})"
                break
            if deadline and time.time() >= deadline:
                r["stop_reason"] = f"time budget spent ({self.settings.budget_s:.0f} s)"
                break
            recipe = todo[0]
            tried.add(recipe.name)
            round_no += 1
            step, state, ran = self._try(round_no, recipe, state, base, margin, self.settings.trials - used, deadline)
            used += len(step["trials"])
            ran_now += ran
            r["steps"].append(step)
            r["final"], r["diagnosis"] = state.summary, state.verdict.to_dict()
            r["final_config"] = state.config.model_dump()
            r["recommendations"] = recommendations(r["steps"], {x.name: x for x in self.recipes})
        r["recommendations"] = recommendations(r["steps"], {x.name: x for x in self.recipes})
        if state.config != base_cfg:
            self.events("phase", {"name": "final against baseline"})
            sp = self._compare(f"final:{state.config.short()}", base_cfg, state.config, "final against baseline")
            r["speedup"] = _ci(sp)
        else:
            r["speedup"] = {"ratio": 1.0, "low": 1.0, "high": 1.0, "pairs": 0}
        r["budget"] = {"trials_used": used, "trials_run_now": ran_now, "trials_limit": self.settings.trials,
                       "wall_s": time.time() - t_start, "budget_s": self.settings.budget_s}
        return r

    def _baseline(self, config: TrainConfig) -> dict[str, Any]:
        try:
            return self.runner.measure(config)
        except TrialFailed as exc:
            raise UserError(
                f"the baseline (default config) of workload {self.runner.workload.name!r} could not be measured: "
                f"{exc.kind}: {exc.reason}. Fix the workload so that `autotune profile` runs, then tune.\n{exc.detail}"
            ) from None

    def _why_stop(self, state: State) -> str:
        v = state.verdict
        if acceptable(v):
            return f"the slowest stage is acceptable: the step is compute-bound ({v.reason}) and every matching recipe was tried"
        advice = ADVICE.get(v.bottleneck)
        return f"no recipe left for the {v.bottleneck.value} bottleneck ({v.reason})" + (f"; in your code: {advice}" if advice else "")

    def _try(self, round_no: int, recipe: Recipe, state: State, base: dict, margin: float,
             trials_left: int, deadline: float | None) -> tuple[dict, State, int]:
        dev = self.runner.device.type
        space = recipe.space(dev, _cores(), self.runner.workload.batch_size)
        name = f"{self.study}/{round_no:02d}-{recipe.name}"
        search = RecipeSearch(self.storage, name, space, state.config, self.runner,
                              Constraints(self.settings.memory_limit, base.get("first_losses", [])), self.settings.seed)
        n = min(recipe.trials, trials_left)  # finished trials of a resumed study count
        self.events("recipe", {"round": round_no, "recipe": recipe.name, "trials": min(n, search.grid)})
        ran = search.run(n, deadline, on_trial=lambda t: self.events("trial", trial_record(t)))
        step = {"round": round_no, "recipe": recipe.name, "bottleneck": state.verdict.bottleneck.value,
                "trials": [trial_record(t) for t in search.study.trials], "accepted": False, "changes": {}, "speedup": None,
                "before": _brief(state.summary)}
        best = search.best()
        if best is None or best.user_attrs.get("config") == state.config.flat():
            step["reason"] = ("every trial was infeasible or failed" if best is None
                              else "no trial beat the current config in the search")
            if best is not None and state.feasible is False:
                step["reason"] = "the current config is over the memory limit and no trial fit"
            return step, state, ran
        cand = TrainConfig().with_changes(best.user_attrs["config"])
        step["changes"] = state.config.diff(cand)
        cand_summary = best.user_attrs["summary"]
        step["after"] = _brief(cand_summary)
        step["after_config"] = cand.flat()
        sp = self._compare(f"{name}:accept", state.config, cand, f"{recipe.name} against current")
        if not state.feasible:
            # The incumbent does not fit: any feasible config is progress, and the fastest wins.
            ratio = "" if sp.get("failed") else f"; throughput ratio {sp['ratio']:.2f}x [{sp['low']:.2f}, {sp['high']:.2f}]"
            step.update(accepted=True, speedup=None if sp.get("failed") else _ci(sp), reason=(
                f"fits the memory limit (peak {cand_summary['peak_memory_bytes']} B, limit {self.settings.memory_limit} B){ratio}"))
        elif sp.get("failed"):
            step["reason"] = f"the interleaved re-measurement failed: {sp['failed']}"
        else:
            step["speedup"] = _ci(sp)
            if sp["low"] > margin:
                step.update(accepted=True, reason=f"{sp['ratio']:.2f}x, interval [{sp['low']:.2f}, {sp['high']:.2f}] clears the noise margin {margin:.3f}")
            else:
                step["reason"] = (f"measured {sp['ratio']:.2f}x, interval [{sp['low']:.2f}, {sp['high']:.2f}] does not clear "
                                  f"the noise margin {margin:.3f} (search estimate was {best.value / state.summary['samples_per_s']:.2f}x)")
        self.events("decision", {"recipe": recipe.name, "accepted": step["accepted"], "reason": step["reason"]})
        if step["accepted"]:
            state = self._state(cand, cand_summary)
        return step, state, ran

    def _header(self) -> dict[str, Any]:
        dev = self.runner.device
        return {
            "autotune_version": __version__, "workload": self.runner.workload.name, "target": self.runner.target,
            "device": dev.type, "memory_limit_bytes": self.settings.memory_limit,
            "machine": {"cores": _cores(), "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
                        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None, "python": platform.python_version()},
            "protocol": self.runner.protocol.describe(),
            "study": {"name": self.study},
        }


def _ci(sp: dict[str, Any]) -> dict[str, Any]:
    return {k: sp.get(k) for k in ("ratio", "low", "high", "pairs")}


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    ot = summary.get("one_time", {})
    return {"samples_per_s": summary.get("samples_per_s"), "peak_memory_bytes": summary.get("peak_memory_bytes"),
            "step_time_s": (summary.get("step_time_s") or {}).get("mean"),
            "one_time_s": ot.get("setup_s", 0.0) + ot.get("first_step_s", 0.0)}


def recommendations(steps: list[dict], recipes: dict[str, Recipe]) -> list[dict[str, Any]]:
    """One per recipe tried that produced a candidate, ranked: accepted by gain, then rejected."""
    out = []
    for st in steps:
        before, after = st.get("before") or {}, st.get("after")
        sp = st.get("speedup") or {}
        rec = {"recipe": st["recipe"], "changes": st.get("changes", {}), "speedup": sp.get("ratio"),
               "ci": [sp.get("low"), sp.get("high")], "accepted": st["accepted"],
               "reason": None if st["accepted"] else st.get("reason"),
               "memory_delta_bytes": None, "one_time_s": None, "payoff_steps": None, "snippet": ""}
        if after:
            if after.get("peak_memory_bytes") is not None and before.get("peak_memory_bytes") is not None:
                rec["memory_delta_bytes"] = after["peak_memory_bytes"] - before["peak_memory_bytes"]
            extra = after["one_time_s"] - before.get("one_time_s", 0.0)
            rec["one_time_s"] = extra
            saved = (before.get("step_time_s") or 0) - (after.get("step_time_s") or 0)
            rec["payoff_steps"] = (0 if extra <= 0 else int(extra / saved) + 1) if saved > 0 else None
        recipe = recipes.get(st["recipe"])
        if recipe and recipe.snippet and st.get("changes"):
            rec["snippet"] = render_snippet(recipe.snippet, st.get("after_config") or {})
        out.append(rec)
    return sorted(out, key=lambda x: (not x["accepted"], -(x["speedup"] or 0)))


def render_snippet(template: str, config: dict[str, Any]) -> str:
    """The recipe's snippet with `{dotted.key}` filled from the config it recommends."""
    text = template
    for key, value in config.items():
        text = text.replace("{" + key + "}", str(value))
    return text


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
