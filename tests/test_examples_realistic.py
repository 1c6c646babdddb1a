"""The realistic examples (ResNet-18 on JPEGs, GPT, Transformer encoder) train, and every
knob family that should apply to each does: small versions, a few steps each."""

from __future__ import annotations

import math

import pytest
import torch

import autotune
from autotune.loop import Trainer
from autotune.workload import facts

CPU = torch.device("cpu")

# (example, has convolutions)
EXAMPLES = [
    pytest.param("resnet_jpeg", True, id="resnet_jpeg"),
    pytest.param("gpt", False, id="gpt"),
    pytest.param("transformer_encoder", False, id="transformer_encoder"),
]


@pytest.fixture
def small(example):
    """`small("gpt")`: that example's small workload (the ResNet needs PIL to decode)."""

    def load(name: str) -> autotune.Workload:
        if name == "resnet_jpeg":
            pytest.importorskip("PIL", reason="the ResNet example decodes JPEGs with Pillow: "
                                "pip install 'autotune[examples]'")
        return autotune.load_workload(example(name))

    return load


def train(wl: autotune.Workload, steps: int, **changes) -> list[float]:
    trainer = Trainer(wl, autotune.TrainConfig().with_changes(changes), CPU)
    losses = trainer.train(steps)
    assert len(losses) == steps and all(math.isfinite(float(x)) for x in losses), losses
    return [float(x) for x in losses]


@pytest.mark.parametrize("name,conv", EXAMPLES)
def test_trains_with_defaults(small, name, conv):
    wl = small(name)
    assert wl.checkpoint_blocks, "every realistic example hints blocks to checkpoint"
    assert facts(wl) == {"conv": conv, "checkpoint_blocks": True, "distributed": False, "repeats_in_workers": False,
                         "sdpa": not conv}  # the transformers call scaled_dot_product_attention; the CNN does not
    train(wl, 3)


@pytest.mark.parametrize("name,conv", EXAMPLES)
def test_activation_checkpointing_wraps_blocks_and_trains(small, name, conv):
    wl = small(name)
    trainer = Trainer(wl, autotune.TrainConfig().with_changes({"memory.activation_checkpointing": True}), CPU)
    wrapped = [m for m in trainer.model.modules() if isinstance(m, wl.checkpoint_blocks) and "forward" in vars(m)]
    assert wrapped, "no hinted block was wrapped"
    losses = trainer.train(2)
    assert all(math.isfinite(float(x)) for x in losses), losses


@pytest.mark.parametrize("name,conv", EXAMPLES)
def test_micro_batches_with_accumulation_train(small, name, conv):
    wl = small(name)
    train(wl, 2, **{"memory.micro_batch_size": wl.batch_size // 2})


@pytest.mark.parametrize("name,conv", EXAMPLES)
def test_bf16_autocast_trains(small, name, conv):
    train(small(name), 2, **{"precision.amp": "bf16"})


def test_channels_last_applies_to_the_resnet(small):
    wl = small("resnet_jpeg")
    trainer = Trainer(wl, autotune.TrainConfig().with_changes({"layout.channels_last": True}), CPU)
    assert trainer.has_conv
    conv = trainer.model.conv1.weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    losses = trainer.train(2)
    assert all(math.isfinite(float(x)) for x in losses), losses
