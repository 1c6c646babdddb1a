"""`optimizer.impl` (foreach / fused) against every optimizer torch.optim exports: the form is
applied and gives the default implementation's updates, or it is a ConfigError at build time."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import autotune
from autotune import apply
from autotune.errors import ConfigError

IMPLS = ("foreach", "fused")

# Exported optimizers the tiny dense model cannot drive, with the reason; each still gets
# a build-only check below (applied with the flag set, or a ConfigError).
EXCLUDED = {
    "LBFGS": "step() needs a closure that re-evaluates the loss (a line search), not a plain step",
    "SparseAdam": "steps on sparse gradients only; the tiny model's gradients are dense",
    "Muon": "takes 2-D (matrix) parameters only; the tiny model has biases",
}


def _discover() -> dict[str, type[torch.optim.Optimizer]]:
    found = {}
    for name in dir(torch.optim):
        obj = getattr(torch.optim, name)
        if (not name.startswith("_") and isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer)
                and obj is not torch.optim.Optimizer):
            found[name] = obj
    return found


ALL = _discover()
CLASSES = {n: c for n, c in ALL.items() if n not in EXCLUDED}


def cfg(impl: str) -> autotune.TrainConfig:
    return autotune.TrainConfig().with_changes({"optimizer.impl": impl})


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, start: int = 0) -> None:
    for i in range(start, start + steps):
        g = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def torch_runs_it_on_cpu(cls: type[torch.optim.Optimizer], impl: str) -> bool:
    """The oracle: torch's own constructor takes the flag and a step runs with it here."""
    if impl not in inspect.signature(cls.__init__).parameters:
        return False
    p = nn.Parameter(torch.zeros(2, 2))
    try:
        opt = cls([p], **{impl: True})
        p.grad = torch.ones_like(p)
        opt.step()
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        return False
    return True


def assert_refused(exc: ConfigError, impl: str, name: str) -> None:
    msg = str(exc)
    assert f"optimizer.impl {impl}" in msg and name in msg and "use default" in msg, msg


def test_discovery_found_the_optimizers():
    assert {"SGD", "Adam", "AdamW"} <= set(CLASSES)
    assert torch.optim.Optimizer not in CLASSES.values()
    assert not set(EXCLUDED) & set(CLASSES)


# --- the contract, for every optimizer -----------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_optimizer_applies_the_impl_or_refuses_it(name, impl):
    cls = CLASSES[name]
    ref_model = tiny_model()
    ref_opt = cls(ref_model.parameters())
    model = tiny_model()
    opt = cls(model.parameters())
    if not torch_runs_it_on_cpu(cls, impl):
        with pytest.raises(ConfigError) as info:
            apply.set_optimizer_impl(opt, cfg(impl))
        assert_refused(info.value, impl, name)
        return
    switched = apply.set_optimizer_impl(opt, cfg(impl))
    assert switched is opt  # torch's optimizers keep the flag in their groups: switched in place
    other = "fused" if impl == "foreach" else "foreach"
    for g in switched.param_groups:
        assert g[impl] is True
        assert not g.get(other)  # never both
    assert switched.defaults[impl] is True
    train(ref_model, ref_opt, 2)
    train(model, switched, 2)
    assert_close(weights(model), weights(ref_model), rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(v, tiny_model().state_dict()[k]) for k, v in weights(model).items())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(n for n in EXCLUDED if n in ALL))
def test_excluded_optimizers_are_applied_or_refused_at_build(name, impl):
    model = tiny_model()
    params = [p for p in model.parameters() if p.dim() == 2] if name == "Muon" else model.parameters()
    opt = ALL[name](params)
    try:
        switched = apply.set_optimizer_impl(opt, cfg(impl))
    except ConfigError as exc:
        assert_refused(exc, impl, name)
    else:
        assert all(g[impl] is True for g in switched.param_groups)


# --- SGD, Adam, AdamW with their hyper-parameters ------------------------------------------

RICH = {
    "SGD": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
    "Adam": lambda groups: torch.optim.Adam(groups, lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=1e-2,
                                            amsgrad=True),
    "AdamW": lambda groups: torch.optim.AdamW(groups, lr=1e-2, betas=(0.85, 0.97), weight_decay=0.1, amsgrad=True),
}
RICH_LR = {"SGD": 0.1, "Adam": 1e-2, "AdamW": 1e-2}  # the constructor's lr, for the group without its own


def rich(name: str, model: nn.Module) -> torch.optim.Optimizer:
    first, second = model[0], model[2]
    return RICH[name]([
        {"params": [first.weight], "lr": 0.05, "weight_decay": 0.0},
        {"params": [first.bias, second.bias], "lr": 0.02},
        {"params": [second.weight]},
    ])


def hyper(opt: torch.optim.Optimizer) -> list[dict]:
    return [{k: v for k, v in g.items() if k not in ("params", "foreach", "fused")} for g in opt.param_groups]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(RICH))
def test_sgd_adam_adamw_keep_hyper_parameters_and_state(name, impl):
    cls = getattr(torch.optim, name)
    if impl == "fused" and not torch_runs_it_on_cpu(cls, impl):
        pytest.skip(f"this torch has no CPU fused {name}")
    ref_model = tiny_model()
    ref = rich(name, ref_model)
    model = tiny_model()
    opt = rich(name, model)
    train(ref_model, ref, 2)
    train(model, opt, 2)  # state accumulated before the switch
    groups_before = hyper(opt)
    ids_before = [[id(p) for p in g["params"]] for g in opt.param_groups]
    state_before = {p: dict(s) for p, s in opt.state.items()}
    assert state_before

    switched = apply.set_optimizer_impl(opt, cfg(impl))

    assert switched is opt
    assert hyper(switched) == groups_before
    assert [g["lr"] for g in switched.param_groups] == [0.05, 0.02, RICH_LR[name]]
    assert [[id(p) for p in g["params"]] for g in switched.param_groups] == ids_before
    for g in switched.param_groups:
        assert g[impl] is True and g["fused" if impl == "foreach" else "foreach"] is False
    # the state is the same (momentum buffers, moments, max moments), not restarted
    assert set(switched.state) == set(state_before)
    for p, s in state_before.items():
        for key, value in s.items():
            if key == "step":
                assert float(switched.state[p]["step"]) == float(value) == 2.0
            else:
                assert switched.state[p][key] is value
    train(ref_model, ref, 2, start=2)
    train(model, switched, 2, start=2)
    assert_close(weights(model), weights(ref_model), rtol=1e-5, atol=1e-6)


def test_adamw_as_nanogpt_builds_it():
    """nanoGPT: decay / no-decay groups, betas, and fused=True where available."""
    model = tiny_model()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), fused=True)
    switched = apply.set_optimizer_impl(opt, cfg("foreach"))
    assert switched is opt
    assert [(g["foreach"], g["fused"], g["weight_decay"], g["betas"]) for g in switched.param_groups] == [
        (True, False, 0.1, (0.9, 0.95)), (True, False, 0.0, (0.9, 0.95))]
    assert all(g["decoupled_weight_decay"] is True for g in switched.param_groups)
    # no longer fused: GradScaler must unscale the gradients itself again
    assert not getattr(switched, "_step_supports_amp_scaling", False)
    train(model, switched, 2)


def test_switch_to_fused_matches_a_fused_constructor():
    model = tiny_model()
    opt = apply.set_optimizer_impl(torch.optim.AdamW(model.parameters()), cfg("fused"))
    built = torch.optim.AdamW(tiny_model().parameters(), fused=True)
    assert opt._step_supports_amp_scaling == built._step_supports_amp_scaling
    assert opt.defaults["fused"] is True and not opt.defaults["foreach"]
    assert {k: v for k, v in opt.defaults.items() if k != "foreach"} == {
        k: v for k, v in built.defaults.items() if k != "foreach"}


def test_groups_added_after_the_switch_take_the_flag():
    model = tiny_model()
    opt = apply.set_optimizer_impl(torch.optim.Adam(model[0].parameters()), cfg("foreach"))
    opt.add_param_group({"params": model[2].parameters()})
    assert opt.param_groups[-1]["foreach"] is True


# --- refusals -------------------------------------------------------------------------------


def test_fused_on_complex_parameters_is_a_config_error():
    p = nn.Parameter(torch.zeros(3, dtype=torch.complex64))
    with pytest.raises(ConfigError) as info:
        apply.set_optimizer_impl(torch.optim.Adam([p]), cfg("fused"))
    assert_refused(info.value, "fused", "Adam")
    assert "refused it here" in str(info.value)


def test_fused_with_differentiable_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        apply.set_optimizer_impl(torch.optim.Adam(tiny_model().parameters(), differentiable=True), cfg("fused"))
    assert_refused(info.value, "fused", "Adam")
    assert "differentiable" in str(info.value)


def test_optimizer_without_the_flag_says_so():
    with pytest.raises(ConfigError) as info:
        apply.set_optimizer_impl(torch.optim.Adamax(tiny_model().parameters()), cfg("fused"))
    assert_refused(info.value, "fused", "Adamax")
    assert "has no fused form" in str(info.value)


def test_refusal_leaves_the_optimizer_untouched():
    model = tiny_model()
    opt = torch.optim.Adam(model.parameters(), differentiable=True)
    before = copy.deepcopy(hyper(opt)), [dict(foreach=g["foreach"], fused=g["fused"]) for g in opt.param_groups]
    with pytest.raises(ConfigError):
        apply.set_optimizer_impl(opt, cfg("fused"))
    after = hyper(opt), [dict(foreach=g["foreach"], fused=g["fused"]) for g in opt.param_groups]
    assert after == before


# --- the rebuild fallback -------------------------------------------------------------------


class FlagOutsideGroups(torch.optim.Optimizer):
    """Takes `foreach` but keeps it on the instance, and has a default its constructor does
    not take (as AdamW's decoupled_weight_decay): only a rebuild can switch it."""

    def __init__(self, params, lr=0.1, momentum=0.5, foreach=None):
        super().__init__(params, {"lr": lr, "momentum": momentum, "not_an_argument": True})
        self.foreach = foreach

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("buf", torch.zeros_like(p))
                buf.mul_(g["momentum"]).add_(p.grad)
                p.add_(buf, alpha=-g["lr"])


def test_rebuild_fallback_passes_only_constructor_arguments_and_keeps_state():
    ref_model, model = tiny_model(), tiny_model()
    ref = FlagOutsideGroups([{"params": ref_model[0].parameters(), "lr": 0.05}, {"params": ref_model[2].parameters()}],
                            momentum=0.8)
    opt = FlagOutsideGroups([{"params": model[0].parameters(), "lr": 0.05}, {"params": model[2].parameters()}],
                            momentum=0.8)
    train(ref_model, ref, 2)
    train(model, opt, 2)
    rebuilt = apply.set_optimizer_impl(opt, cfg("foreach"))
    assert rebuilt is not opt and isinstance(rebuilt, FlagOutsideGroups)
    assert rebuilt.foreach is True
    assert [(g["lr"], g["momentum"]) for g in rebuilt.param_groups] == [(0.05, 0.8), (0.1, 0.8)]
    assert {id(p) for g in rebuilt.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}
    assert len(rebuilt.state) == len(opt.state) == 4
    train(ref_model, ref, 2, start=2)
    train(model, rebuilt, 2, start=2)
    assert_close(weights(model), weights(ref_model), rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError) as info:
        apply.set_optimizer_impl(opt, cfg("fused"))
    assert_refused(info.value, "fused", "FlagOutsideGroups")
