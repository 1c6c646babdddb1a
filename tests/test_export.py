"""`autotune export`: the tuned config as Hugging Face, Lightning, accelerate and torchrun settings,
and (where the frameworks are installed) that those frameworks take the settings."""

from __future__ import annotations

import ast

import pytest
import yaml
from test_report import CONFIG0, make_report

from autotune.cli import main
from autotune.config import from_dict, from_flat
from autotune.errors import UserError
from autotune.export import (
    TARGETS,
    export,
    hf_kwargs,
    lightning_dataloader_kwargs,
    lightning_kwargs,
)
from autotune.record import Report
from autotune.report import write_reports

BATCH = 32
TUNED = dict(CONFIG0, **{
    "data.num_workers": 2, "data.prefetch_factor": 4, "data.persistent_workers": True,
    "precision.amp": "bf16", "compile.mode": "max-autotune", "memory.micro_batch_size": 8,
    "memory.activation_checkpointing": True, "layout.channels_last": True, "backend.num_threads": 2,
})
DATALOADER_GAIN = "dataloader measured 4.13x [3.88, 4.41]"
AMP_GAIN = "amp measured 1.31x [1.20, 1.44]"
COMPILE_GAIN = "compile measured 1.12x [1.05, 1.19]"
MICRO_GAIN = "micro_batch measured 1.08x [1.02, 1.15]"


def _rec(recipe: str, changes: dict, speedup: float, ci: list[float], accepted: bool = True) -> dict:
    return {"recipe": recipe, "changes": changes, "speedup": speedup, "ci": ci, "accepted": accepted}


def tuned_report() -> Report:
    """The realistic report of test_report, tuned further: dataloader, bf16, compile, micro-batches."""
    base = make_report()
    recs = [
        _rec("dataloader", {"data.num_workers": [0, 2], "data.prefetch_factor": [None, 4],
                            "data.persistent_workers": [False, True]}, 4.13, [3.88, 4.41]),
        _rec("amp", {"precision.amp": ["none", "bf16"]}, 1.31, [1.20, 1.44]),
        _rec("compile", {"compile.mode": ["none", "max-autotune"]}, 1.12, [1.05, 1.19]),
        _rec("micro_batch", {"memory.micro_batch_size": [None, 8]}, 1.08, [1.02, 1.15]),
        _rec("checkpointing", {"memory.activation_checkpointing": [False, True]}, 1.06, [1.03, 1.09]),
        _rec("channels_last", {"layout.channels_last": [False, True]}, 1.04, [1.01, 1.07]),
        _rec("threads", {"backend.num_threads": [None, 2]}, 1.05, [1.02, 1.08]),
        _rec("optimizer", {"optimizer.impl": ["default", "fused"]}, 1.01, [0.97, 1.05], accepted=False),
    ]
    data = base.model_dump(mode="json", by_alias=True)
    data.update(final_config=TUNED, recommendations=recs)
    return Report.model_validate(data)


def _dict_literal(text: str, name: str) -> dict:
    """The `name = {...}` literal in the rendered text, read back with ast.literal_eval."""
    lines = text.splitlines()
    start = lines.index(f"{name} = {{")
    end = lines.index("}", start)
    return ast.literal_eval("\n".join(["{"] + lines[start + 1:end + 1]))


def _line(text: str, needle: str) -> str:
    found = [ln for ln in text.splitlines() if needle in ln]
    assert found, f"no line with {needle!r} in:\n{text}"
    return found[0]


@pytest.fixture
def report() -> Report:
    return tuned_report()


# --- content -----------------------------------------------------------------------------

def test_yaml_is_exactly_tuned_yaml(report, tmp_path):
    from autotune.report import write_tuned_config

    path = write_tuned_config(report, tmp_path)
    assert export(report, "yaml") == path.read_text(encoding="utf-8")
    # A report written before the distributed.* keys existed exports them at their defaults.
    assert from_dict(yaml.safe_load(export(report, "yaml"))).flat() == from_flat(TUNED).flat()


def test_hf_kwargs_keep_the_global_batch(report):
    kw = hf_kwargs(report, BATCH)
    assert kw == {
        "dataloader_num_workers": 2, "dataloader_prefetch_factor": 4, "dataloader_pin_memory": False,
        "dataloader_persistent_workers": True, "bf16": True, "torch_compile": True,
        "torch_compile_mode": "max-autotune", "per_device_train_batch_size": 8, "gradient_accumulation_steps": 4,
        "gradient_checkpointing": True,
    }
    assert kw["per_device_train_batch_size"] * kw["gradient_accumulation_steps"] == BATCH


def test_hf_text_holds_the_dict_and_the_gains(report):
    text = export(report, "hf", BATCH)
    assert _dict_literal(text, "training_args") == hf_kwargs(report, BATCH)
    assert DATALOADER_GAIN in _line(text, "'dataloader_num_workers'")
    assert DATALOADER_GAIN in _line(text, "'dataloader_prefetch_factor'")
    assert AMP_GAIN in _line(text, "'bf16'")
    assert COMPILE_GAIN in _line(text, "'torch_compile_mode'")
    assert MICRO_GAIN in _line(text, "'gradient_accumulation_steps'")
    assert "TrainingArguments defaults to True" in _line(text, "'dataloader_pin_memory'")
    # What TrainingArguments cannot say is a comment with the code line that does it.
    assert "model = model.to(memory_format=torch.channels_last)" in _line(text, "layout.channels_last").lstrip("# ")
    assert _line(text, "layout.channels_last").startswith("#")
    threads = _line(text, "backend.num_threads")
    assert threads.startswith("#") and "torch.set_num_threads(2)" in threads and "threads measured 1.05x" in threads
    # The rejected optimizer change is not exported.
    assert "fused" not in text and "optimizer measured" not in text
    compile(text, "hf.py", "exec")  # valid Python


def test_fused_and_foreach_optimizer_in_hf():
    data = tuned_report().model_dump(mode="json", by_alias=True)
    for impl, expect in (("fused", "adamw_torch_fused"), ("foreach", None)):
        data["final_config"] = dict(CONFIG0, **{"optimizer.impl": impl})
        data["recommendations"] = [_rec("optimizer", {"optimizer.impl": ["default", impl]}, 1.1, [1.05, 1.15])]
        r = Report.model_validate(data)
        kw = hf_kwargs(r)
        text = export(r, "hf")
        if expect:
            assert kw["optim"] == expect and "optimizer measured 1.10x [1.05, 1.15]" in _line(text, "'optim'")
        else:
            assert "optim" not in kw
            line = _line(text, "optimizer.impl")
            assert line.startswith("#") and "foreach=True" in line and "no TrainingArguments" in line


def test_micro_batch_needs_the_global_batch(report):
    with pytest.raises(UserError, match="--batch-size"):
        hf_kwargs(report)
    with pytest.raises(UserError, match="does not divide"):
        hf_kwargs(report, 12)
    with pytest.raises(UserError, match="--batch-size"):
        lightning_kwargs(report)
    # Without micro-batches the batch size is optional.
    plain = make_report()
    assert "per_device_train_batch_size" not in hf_kwargs(plain)
    assert hf_kwargs(plain, 16)["per_device_train_batch_size"] == 16
    assert hf_kwargs(plain, 16)["gradient_accumulation_steps"] == 1


def test_lightning_text_and_kwargs(report):
    assert lightning_kwargs(report, BATCH) == {"precision": "bf16-mixed", "accumulate_grad_batches": 4}
    assert lightning_dataloader_kwargs(report, BATCH) == {"batch_size": 8, "num_workers": 2, "prefetch_factor": 4,
                                                          "persistent_workers": True}
    text = export(report, "lightning", BATCH)
    assert _dict_literal(text, "trainer_kwargs") == lightning_kwargs(report, BATCH)
    assert _dict_literal(text, "dataloader_kwargs") == lightning_dataloader_kwargs(report, BATCH)
    assert AMP_GAIN in _line(text, "'precision'")
    assert MICRO_GAIN in _line(text, "'accumulate_grad_batches'")
    assert DATALOADER_GAIN in _line(text, "'num_workers'")
    compile_line = _line(text, "torch.compile(")
    assert "model = torch.compile(model, mode='max-autotune')" in compile_line and COMPILE_GAIN in compile_line
    assert "torch.utils.checkpoint.checkpoint" in _line(text, "memory.activation_checkpointing")
    compile(text, "lightning.py", "exec")


def test_accelerate_yaml(report):
    text = export(report, "accelerate", BATCH)
    doc = yaml.safe_load(text)
    assert doc["mixed_precision"] == "bf16"
    assert doc["dynamo_config"] == {"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune"}
    assert doc["distributed_type"] == "NO" and doc["num_processes"] == 1
    assert AMP_GAIN in _line(text, "mixed_precision:")
    assert COMPILE_GAIN in _line(text, "dynamo_mode:")
    accum = _line(text, "gradient_accumulation_steps")
    assert accum.startswith("#") and "Accelerator(gradient_accumulation_steps=4)" in accum and MICRO_GAIN in accum
    assert "num_workers=2" in _line(text, "data.num_workers") and DATALOADER_GAIN in _line(text, "data.num_workers")
    plain = yaml.safe_load(export(make_report(), "accelerate"))
    assert plain["mixed_precision"] == "no" and "dynamo_config" not in plain


def test_torchrun_command(report):
    text = export(report, "torchrun", BATCH)
    lines = text.splitlines()
    assert lines[-1] == "OMP_NUM_THREADS=2 torchrun --standalone --nproc_per_node=1 train.py"
    assert all(ln.startswith("#") for ln in lines[:-1])
    assert "torch.autocast('cpu', dtype=torch.bfloat16)" in _line(text, "precision.amp") and AMP_GAIN in text
    assert "num_workers=2" in _line(text, "data.num_workers")
    assert "mode='max-autotune'" in _line(text, "compile.mode")
    assert "every 4 micro-batches" in _line(text, "memory.micro_batch_size")
    assert export(make_report(), "torchrun").splitlines()[-1] == "torchrun --standalone --nproc_per_node=1 train.py"


def test_defaults_only_where_the_target_needs_them():
    plain = make_report()  # only the dataloader was tuned
    assert hf_kwargs(plain) == {"dataloader_num_workers": 8, "dataloader_prefetch_factor": 2,
                                "dataloader_pin_memory": False}
    assert lightning_kwargs(plain) == {}
    assert lightning_dataloader_kwargs(plain) == {"num_workers": 8, "prefetch_factor": 2}


def test_unknown_target():
    with pytest.raises(UserError, match="not a known target"):
        export(make_report(), "deepspeed")


# --- the command line --------------------------------------------------------------------

def test_cli_prints_and_writes(report, tmp_path, capsys):
    write_reports(report, tmp_path)
    assert main(["export", str(tmp_path), "--to", "hf", "--batch-size", str(BATCH)]) == 0
    assert capsys.readouterr().out == export(report, "hf", BATCH)
    out = tmp_path / "accelerate.yaml"
    assert main(["export", str(tmp_path), "--to", "accelerate", "--batch-size", "32", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == export(report, "accelerate", BATCH)
    assert main(["export", str(tmp_path), "--to", "yaml"]) == 0
    assert capsys.readouterr().out.endswith(export(report, "yaml"))


@pytest.mark.parametrize("argv, message", [
    (["export", "{empty}", "--to", "hf"], "report.json does not exist"),
    (["export", "{missing}", "--to", "hf"], "is not a folder"),
    (["export", "{full}", "--to", "hf"], "--batch-size"),
    (["export", "{full}", "--to", "hf", "--batch-size", "0"], "--batch-size 0 is out of range"),
    (["export", "{full}", "--to", "hf", "--batch-size", "12"], "does not divide"),
])
def test_cli_bad_input_exits_2(tmp_path, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    write_reports(tuned_report(), tmp_path / "full")
    paths = {"empty": tmp_path / "empty", "missing": tmp_path / "missing", "full": tmp_path / "full"}
    assert main([a.format(**paths) for a in argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_unknown_target_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["export", str(tmp_path), "--to", "deepspeed"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_targets_listed_in_help():
    assert set(TARGETS) == {"yaml", "lightning", "hf", "accelerate", "torchrun"}


# --- the proof: the frameworks take the settings ------------------------------------------

def test_transformers_training_arguments_take_the_kwargs(report, tmp_path):
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                          **hf_kwargs(report, BATCH))
    assert args.dataloader_num_workers == 2
    assert args.dataloader_prefetch_factor == 4
    assert args.dataloader_persistent_workers is True
    assert args.dataloader_pin_memory is False
    assert args.bf16 is True
    assert args.gradient_accumulation_steps == 4
    assert args.per_device_train_batch_size == 8
    assert args.gradient_checkpointing is True
    assert args.torch_compile is True and args.torch_compile_mode == "max-autotune"


def test_accelerate_reads_the_config_file(report, tmp_path):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig

    path = tmp_path / "accelerate.yaml"
    path.write_text(export(report, "accelerate", BATCH), encoding="utf-8")
    config = ClusterConfig.from_yaml_file(str(path))  # refuses unknown keys
    assert str(config.mixed_precision) == "bf16"
    assert config.dynamo_config == {"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune"}


def test_lightning_trainer_takes_the_kwargs(report, tmp_path):
    lightning = pytest.importorskip("lightning")
    trainer = lightning.Trainer(**lightning_kwargs(report, BATCH), accelerator="cpu", max_steps=2,
                                default_root_dir=str(tmp_path), logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    assert trainer.accumulate_grad_batches == 4
    assert trainer.precision == "bf16-mixed"


def test_lightning_trains_with_the_exported_kwargs(report, tmp_path):
    lightning = pytest.importorskip("lightning")
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    seen = {}

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            out = self.net(x)
            seen["dtype"] = out.dtype
            seen["autocast"] = torch.is_autocast_enabled("cpu")
            seen["workers"] = self.trainer.train_dataloader.num_workers
            return torch.nn.functional.mse_loss(out.float(), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dl_kwargs = lightning_dataloader_kwargs(report, BATCH)
    ds = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(ds, **dl_kwargs)
    assert loader.num_workers == 2 and loader.batch_size == 8
    trainer = lightning.Trainer(**lightning_kwargs(report, BATCH), accelerator="cpu", max_steps=2,
                                default_root_dir=str(tmp_path), logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), loader)
    assert trainer.global_step == 2
    assert seen == {"dtype": torch.bfloat16, "autocast": True, "workers": 2}


def test_the_batch_size_recorded_in_the_report_is_used(report):
    recorded = report.model_copy(update={"batch_size": 32})
    kw = hf_kwargs(recorded)
    assert kw["per_device_train_batch_size"] * kw["gradient_accumulation_steps"] == 32
    assert lightning_kwargs(recorded)["accumulate_grad_batches"] == kw["gradient_accumulation_steps"]
    assert hf_kwargs(recorded, 64)["gradient_accumulation_steps"] == 2 * kw["gradient_accumulation_steps"]  # flag wins


def test_transformers_trainer_trains_with_the_exported_kwargs(report, tmp_path):
    """Two optimizer steps of a tiny GPT-2 (built from a config) under the exported
    TrainingArguments: the loader has the workers, the forward runs under bf16 autocast,
    the model checkpoints its blocks, and each step accumulates the micro-batches."""
    transformers = pytest.importorskip("transformers")
    import torch

    kwargs = {**hf_kwargs(report, BATCH), "torch_compile": False}  # compile is checked on the arguments above
    kwargs.pop("torch_compile_mode", None)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    seen = []
    model.transformer.h[0].register_forward_hook(
        lambda m, a, o: seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))))
    ids = torch.randint(0, 64, (BATCH * 2, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": x, "labels": x} for x in ids]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=2,
                                          logging_strategy="no", save_strategy="no", **kwargs)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    assert trainer.get_train_dataloader().num_workers == 2
    trainer.train()
    assert model.is_gradient_checkpointing
    assert seen and all(on and dtype == torch.bfloat16 for on, dtype in seen)
    # 2 steps x 4 micro-batches of 8 (the global batch 32 kept): 8 forward passes of block 0
    # (checkpointing reruns some in backward, so at least that many).
    assert len(seen) >= 2 * args.gradient_accumulation_steps
