"""autotune.integrations: a LightningModule and a Hugging Face model as Workloads that
autotune's own training loop trains."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import EXAMPLES

from autotune.config import TrainConfig
from autotune.errors import UserError
from autotune.loop import Trainer
from autotune.workload import Workload, load_workload


def _train(workload: Workload, config: TrainConfig | None = None, steps: int = 2):
    run = Trainer(workload, config or TrainConfig(), torch.device("cpu"), seed=0).run(steps, 0)
    assert len(run.losses) == steps and all(torch.isfinite(torch.tensor(run.losses)))
    return run


def test_lightning_module_trains_in_autotune_loop():
    pytest.importorskip("lightning")
    w = load_workload(str(EXAMPLES / "lightning_tiny.py"))
    assert w.name == "lightning tiny classifier" and w.batch_size == 32
    _train(w)
    _train(w, TrainConfig().with_changes({"memory.micro_batch_size": 8, "precision.amp": "bf16"}))


def test_lightning_first_of_several_optimizers_with_a_warning():
    lightning = pytest.importorskip("lightning")
    from lightning_tiny import TinyClassifier

    from autotune.integrations.lightning import workload

    class Two(TinyClassifier):
        def configure_optimizers(self):
            sgd = torch.optim.SGD(self.parameters(), lr=0.1)
            adam = torch.optim.Adam(self.parameters(), lr=0.1)
            return [sgd, adam], [torch.optim.lr_scheduler.StepLR(sgd, 1)]

    assert issubclass(Two, lightning.LightningModule)
    with pytest.warns(UserWarning, match="2 optimizers"):
        w = workload(Two, batch_size=16)
    assert w.batch_size == 16
    trainer = Trainer(w, TrainConfig(), torch.device("cpu"), seed=0)
    assert isinstance(trainer.optimizer, torch.optim.SGD)
    _train(w)


def test_lightning_bad_module():
    pytest.importorskip("lightning")
    from autotune.integrations.lightning import workload

    with pytest.raises(UserError, match="not a lightning.LightningModule"):
        workload(lambda: torch.nn.Linear(2, 2))


def test_hf_model_trains_in_autotune_loop():
    pytest.importorskip("transformers")
    w = load_workload(str(EXAMPLES / "hf_tiny.py"))
    assert w.name == "hf tiny gpt2" and w.batch_size == 16
    assert [b.__name__ for b in w.checkpoint_blocks] == ["GPT2Block"]
    _train(w)
    _train(w, TrainConfig().with_changes({"memory.micro_batch_size": 4, "memory.activation_checkpointing": True}))


def test_hf_batch_size_and_optimizer_from_args(tmp_path):
    transformers = pytest.importorskip("transformers")
    from hf_tiny import Tokens, model_init

    from autotune.integrations.hf import workload

    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4,
                                          gradient_accumulation_steps=2, learning_rate=1e-3, weight_decay=0.1,
                                          report_to=[], use_cpu=True)
    w = workload(model_init, Tokens(64), args=args)
    assert w.batch_size == 8
    opt = Trainer(w, TrainConfig(), torch.device("cpu"), seed=0).optimizer
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.param_groups[0]["lr"] == 1e-3 and opt.param_groups[0]["weight_decay"] == 0.1
    with pytest.raises(UserError, match="TrainingArguments"):
        workload(model_init, Tokens(64), args={"lr": 1})


def test_missing_framework_says_what_to_install(monkeypatch):
    from autotune.integrations import hf, lightning

    monkeypatch.setitem(sys.modules, "lightning", None)  # import lightning -> ImportError
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(UserError, match=r"pip install 'autotune\[lightning\]'"):
        lightning.workload(lambda: None)
    with pytest.raises(UserError, match=r"pip install 'autotune\[hf\]'"):
        hf.workload(lambda: None, [])
