"""The attention recipe: a probe finds models that call scaled_dot_product_attention, and
`attention.backend` really changes the kernel every forward pass runs."""

from __future__ import annotations

import pytest
import torch

from autotune import Protocol, TrainConfig, apply, measure
from autotune.codeline import code_line
from autotune.recipes import load_recipes
from autotune.recommend import render_snippet
from autotune.workload import Workload, calls_sdpa, facts


class Attend(torch.nn.Module):
    def __init__(self, need_weights: bool = False) -> None:
        super().__init__()
        self.attn, self.head, self.need_weights = torch.nn.MultiheadAttention(16, 2, batch_first=True), \
            torch.nn.Linear(16, 1), need_weights

    def forward(self, x):
        return self.head(self.attn(x, x, x, need_weights=self.need_weights)[0]).mean()


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.randn(6, 16, generator=torch.Generator().manual_seed(i))


def workload(model=Attend, loss=lambda m, b: m(b)) -> Workload:
    return Workload(name="attend", model=model, dataset=Tokens(), optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
                    loss=loss, batch_size=4)


def test_the_probe_finds_scaled_dot_product_attention_and_restores_it():
    original = torch.nn.functional.scaled_dot_product_attention
    assert facts(workload())["sdpa"] is True
    # need_weights=True makes nn.MultiheadAttention compute the weights itself, without SDPA
    assert calls_sdpa(workload(), Attend(need_weights=True), Tokens()) is False
    assert calls_sdpa(workload(lambda: torch.nn.Linear(16, 1)), torch.nn.Linear(16, 1), Tokens()) is False

    def broken(m, b):
        raise ValueError("a loss that cannot run")

    assert calls_sdpa(workload(loss=broken), Attend(), Tokens()) is False
    assert torch.nn.functional.scaled_dot_product_attention is original


def test_the_backend_changes_the_kernel_each_forward_runs():
    q = torch.randn(2, 2, 6, 8)
    math = TrainConfig().with_changes({"attention.backend": "MATH"})
    with apply.attention(math):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))
    cuda_only = TrainConfig().with_changes({"attention.backend": "EFFICIENT_ATTENTION"})
    with pytest.raises(RuntimeError), apply.attention(cuda_only):  # no memory-efficient kernel on a CPU
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    with apply.attention(TrainConfig()):  # the default forces nothing
        torch.nn.functional.scaled_dot_product_attention(q, q, q)


def test_the_measured_loop_runs_under_the_backend():
    config = TrainConfig().with_changes({"attention.backend": "MATH"})
    m = measure(workload(), config, torch.device("cpu"), Protocol(windows=2, steps=2, warmup_steps=1))
    assert m.summary().config["attention.backend"] == "MATH" and m.summary().measured_steps == 4
    with pytest.raises(Exception, match="kernel"):  # a backend the inputs cannot use fails the trial
        measure(workload(), TrainConfig().with_changes({"attention.backend": "EFFICIENT_ATTENTION"}),
                torch.device("cpu"), Protocol(windows=2, steps=2, warmup_steps=1))


def test_the_recipe_applies_on_cuda_to_attention_models_and_says_how():
    r = next(x for x in load_recipes() if x.name == "attention")
    assert r.applies("cuda", {"sdpa": True})[0] and not r.applies("cuda", {"sdpa": False})[0]
    assert not r.applies("cpu", {"sdpa": True})[0]
    config = TrainConfig().with_changes({"attention.backend": "FLASH_ATTENTION"}).flat()
    assert "sdpa_kernel(SDPBackend.FLASH_ATTENTION)" in render_snippet(r.snippet, config)
    assert "SDPBackend.CUDNN_ATTENTION" in code_line("attention.backend", "CUDNN_ATTENTION")
