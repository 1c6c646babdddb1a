"""The CUDA knobs and the CUDA stage clock, on a tiny workload (skipped without CUDA)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import autotune
from autotune import Protocol, measure
from autotune.clock import STAGES
from autotune.config import from_flat
from autotune.loop import Trainer

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
TUNED = {
    "data.pin_memory": True,
    "data.non_blocking": True,
    "precision.tf32": True,
    "precision.amp": "fp16",
    "layout.channels_last": True,
    "backend.cudnn_benchmark": True,
}


PRECISION_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")  # torch 2.9 and later


def _tf32() -> tuple:
    """TF32 for matmuls and convolutions, read in the API autotune writes (mixing them raises)."""
    if PRECISION_API:
        return torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.fixture(autouse=True)
def _restore_backends():
    saved = (_tf32(), torch.backends.cudnn.benchmark, torch.get_num_threads())
    yield
    owners = ((torch.backends.cuda.matmul, torch.backends.cudnn.conv) if PRECISION_API else
              (torch.backends.cuda.matmul, torch.backends.cudnn))
    for owner, value in zip(owners, saved[0]):
        setattr(owner, "fp32_precision" if PRECISION_API else "allow_tf32", value)
    torch.backends.cudnn.benchmark = saved[1]
    torch.set_num_threads(saved[2])


class Images(torch.utils.data.Dataset):
    def __init__(self, n: int = 128, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, 16, 16, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )


def make(loss=None, **kw) -> autotune.Workload:
    base = dict(
        name="tiny-gpu",
        model=convnet,
        dataset=lambda: Images(128),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        loss=loss or (lambda model, batch: F.cross_entropy(model(batch[0]), batch[1])),
        batch_size=32,
    )
    base.update(kw)
    return autotune.Workload(**base)


def test_cuda_knobs_are_applied():
    seen: dict[str, list] = {"dtype": [], "device": [], "cl": []}

    def loss(model, batch):
        x = batch[0]
        seen["device"].append(x.device.type)
        seen["cl"].append(x.is_contiguous(memory_format=torch.channels_last))
        out = model(x)
        seen["dtype"].append(out.dtype)
        return F.cross_entropy(out.float(), batch[1])

    t = Trainer(make(loss), from_flat(TUNED), CUDA)
    assert _tf32() == (("tf32", "tf32") if PRECISION_API else (True, True))
    assert torch.backends.cudnn.benchmark
    assert t.model[0].weight.is_cuda
    assert t.model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert isinstance(t.scaler, torch.amp.GradScaler) and t.scaler.is_enabled()

    stream = t.batches()
    host = next(stream)
    stream.close()
    assert host[0].is_pinned() and host[1].is_pinned()

    losses = t.train(4)
    torch.cuda.synchronize()
    assert all(math.isfinite(v) for v in losses)
    assert seen["device"] == ["cuda"] * 4
    assert seen["cl"] == [True] * 4
    assert seen["dtype"] == [torch.float16] * 4
    assert t.scaler.get_scale() > 0
    assert all(p.dtype == torch.float32 for p in t.model.parameters())


def test_the_default_config_leaves_pytorchs_own_tf32_and_cudnn_flags_on_cuda():
    """The baseline is PyTorch's defaults: building the default config writes no flag."""
    before = (_tf32(), torch.backends.cudnn.benchmark)
    Trainer(make(), autotune.TrainConfig(), CUDA)
    assert (_tf32(), torch.backends.cudnn.benchmark) == before


@pytest.mark.skipif(not torch.cuda.is_available() or not torch.cuda.is_bf16_supported(), reason="needs bf16")
def test_amp_bf16_on_cuda():
    dtypes = []

    def loss(model, batch):
        out = model(batch[0])
        dtypes.append(out.dtype)
        return F.cross_entropy(out.float(), batch[1])

    t = Trainer(make(loss), from_flat({"precision.amp": "bf16"}), CUDA)
    assert t.scaler is None
    assert all(math.isfinite(v) for v in t.train(2))
    assert dtypes == [torch.bfloat16] * 2


def test_micro_batches_match_the_full_batch_on_cuda():
    wl = make()
    full = Trainer(wl, autotune.TrainConfig(), CUDA)
    micro = Trainer(wl, from_flat({"memory.micro_batch_size": 8}), CUDA)
    assert_close(micro.train(3), full.train(3), rtol=1e-4, atol=1e-5)
    for a, b in zip(full.model.parameters(), micro.model.parameters()):
        assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_fused_optimizer_on_cuda():
    wl = make(optimizer=lambda p: torch.optim.Adam(p, lr=1e-3))
    t = Trainer(wl, from_flat({"optimizer.impl": "fused"}), CUDA)
    assert all(g["fused"] for g in t.optimizer.param_groups)
    assert all(math.isfinite(v) for v in t.train(2))


def _check_measurement(m: autotune.Measurement, steps: int) -> autotune.Summary:
    s = m.summary()
    assert s.measured_steps == steps
    for w in m.windows:
        assert w.samples_per_s > 0
        for step in w.steps:
            assert all(step[k] >= 0 for k in STAGES), step
            assert sum(step[k] for k in STAGES) == pytest.approx(step["step"], rel=1e-6, abs=1e-9)
            assert step["forward"] > 0 and step["backward"] > 0 and step["optimizer"] > 0
    assert sum(v.s for v in s.stages.values()) == pytest.approx(s.step_time_s.mean, rel=1e-9)
    assert m.peak_memory_bytes is not None and m.peak_memory_bytes > 0
    assert s.samples_per_s > 0
    return s


@pytest.mark.parametrize("flat", [{}, TUNED], ids=["default", "tuned"])
def test_measure_on_cuda(flat):
    m = measure(make(), from_flat(flat), CUDA, Protocol(windows=2, steps=5, warmup_steps=1))
    s = _check_measurement(m, 10)
    assert s.config == from_flat(flat).flat()
    assert all(math.isfinite(v) for w in m.windows for v in w.losses)


def test_measure_on_cuda_with_micro_batches_and_workers():
    cfg = from_flat({"memory.micro_batch_size": 8, "data.num_workers": 2, "data.pin_memory": True})
    m = measure(make(), cfg, CUDA, Protocol(windows=2, steps=5, warmup_steps=1))
    # a loader holding 2 workers x 2 batches gets windows of at least 4 x 4 steps
    _check_measurement(m, 2 * 16)
