"""Process-wide flags: unset means PyTorch's own value, and two configs sharing a process each
run their windows under their own flags (in-process comparisons cannot leak one into the other)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autotune
from autotune import apply, loop
from autotune.config import TrainConfig
from autotune.measure import Protocol, Session

measuring = importlib.import_module("autotune.measure")  # the package's `measure` is a function

PRECISION_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")


def _state() -> tuple:
    m = torch.backends.cuda.matmul
    return (m.fp32_precision if PRECISION_API else m.allow_tf32, torch.backends.cudnn.benchmark)


@pytest.fixture(autouse=True)
def _restore():
    """Each test starts from the process's flags and leaves them so (autotune's record of them too)."""
    saved = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision,
             torch.backends.cudnn.benchmark) if PRECISION_API else None
    flags = [(f, f.initial, f.changed) for f in (apply._MATMUL, apply._CONV, apply._BENCHMARK)]
    yield
    if saved:
        (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision,
         torch.backends.cudnn.benchmark) = saved
    for f, initial, changed in flags:
        f.initial, f.changed = initial, changed


def test_the_default_config_leaves_every_flag_as_pytorch_set_it():
    before = _state()
    apply.apply_backend(TrainConfig(), "cpu")
    assert _state() == before
    if PRECISION_API:  # the legacy API was never touched: reading it still works
        assert torch.get_float32_matmul_precision() in {"highest", "high", "medium"}


@pytest.mark.skipif(not PRECISION_API, reason="torch before 2.9 has no fp32_precision API")
def test_a_set_flag_is_written_in_the_new_api_and_unset_goes_back_to_pytorchs_value():
    matmul, conv = torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision
    apply.apply_backend(TrainConfig().with_changes({"precision.tf32": True, "backend.cudnn_benchmark": True}), "cpu")
    assert torch.backends.cuda.matmul.fp32_precision == "tf32" and torch.backends.cudnn.conv.fp32_precision == "tf32"
    assert torch.backends.cudnn.benchmark is True
    apply.apply_backend(TrainConfig().with_changes({"precision.tf32": False}), "cpu")
    assert torch.backends.cuda.matmul.fp32_precision == "ieee" and torch.backends.cudnn.benchmark is False
    apply.apply_backend(TrainConfig(), "cpu")
    assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == (matmul, conv)


class _Seen(nn.Module):
    """A linear model that notes the process-wide flags each forward runs under."""

    def __init__(self, seen: list) -> None:
        super().__init__()
        self.lin, self.seen = nn.Linear(8, 2), seen

    def forward(self, x):
        self.seen.append(_state())
        return self.lin(x)


def test_two_configs_in_one_process_each_run_their_windows_under_their_own_flags(monkeypatch):
    """Two sessions open side by side in one process (as an in-process comparison runs them),
    their windows in turns: every step of each sees its own config's flags, not the last built."""
    monkeypatch.setattr(loop, "check_applicable", lambda *a: None)  # CUDA-only flags, on CPU: the mechanism
    monkeypatch.setattr(measuring, "check_applicable", lambda *a: None)
    seen: dict[str, list] = {"on": [], "off": []}

    def workload(tag: str) -> autotune.Workload:
        return autotune.Workload(
            name=f"flags-{tag}", model=lambda: _Seen(seen[tag]),
            dataset=lambda: torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))),
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
            loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]), batch_size=8)

    on = TrainConfig().with_changes({"precision.tf32": True, "backend.cudnn_benchmark": True})
    off = TrainConfig().with_changes({"precision.tf32": False, "backend.cudnn_benchmark": False})
    protocol = Protocol(warmup_steps=1, steps=2, windows=2, profile_steps=1)
    a = Session(workload("on"), on, torch.device("cpu"), protocol)
    b = Session(workload("off"), off, torch.device("cpu"), protocol)  # built last: its flags are the process's now
    try:
        for _ in range(2):
            a.window()
            b.window()
    finally:
        a.close()
        b.close()
    want_on = ("tf32" if PRECISION_API else True, True)
    want_off = ("ieee" if PRECISION_API else False, False)
    assert seen["on"] and set(seen["on"]) == {want_on}, seen["on"]
    assert seen["off"] and set(seen["off"]) == {want_off}, seen["off"]
