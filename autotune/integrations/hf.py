"""A Hugging Face model, as `transformers.Trainer` takes it, as an `autotune.Workload`.

The loss is the model output's `loss` (the batch must hold the labels); the optimizer is
AdamW with the arguments' learning rate, betas, epsilon and weight decay (applied to every
parameter, where `Trainer` skips biases and norms); the global batch is
`per_device_train_batch_size * gradient_accumulation_steps`, and autotune's own
`memory.micro_batch_size` decides how it is split. The model's `_no_split_modules` (its
transformer blocks) are what activation checkpointing may wrap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autotune.errors import UserError, call_user
from autotune.workload import Workload

from . import require


def _blocks(model: torch.nn.Module) -> tuple[type, ...]:
    names = set(getattr(model, "_no_split_modules", None) or ())
    return tuple({type(m) for m in model.modules() if type(m).__name__ in names})


def workload(model_init: Callable[[], torch.nn.Module], train_dataset: Any, data_collator: Callable | None = None,
             args: Any = None, name: str | None = None) -> Workload:
    """An `autotune.Workload` for what `transformers.Trainer(model_init=..., args=..., ...)` would train.

    Args:
        model_init: Returns a fresh model whose output has `.loss` (e.g. `AutoModelForCausalLM.from_config`).
        train_dataset: The training dataset.
        data_collator: Builds a batch (a dict of tensors, labels included); default
            `transformers.default_data_collator`.
        args: `transformers.TrainingArguments` (default `TrainingArguments(output_dir="autotune-hf")`).
        name: Shown in reports (default: `args.run_name`, else the model's class name).

    Raises:
        UserError: transformers is not installed, or `args` is not a `TrainingArguments`.
    """
    transformers = require("transformers", "hf", "autotune.integrations.hf")
    if args is None:
        args = transformers.TrainingArguments(output_dir="autotune-hf", report_to=[])
    if not isinstance(args, transformers.TrainingArguments):
        raise UserError(f"args must be a transformers.TrainingArguments, got {type(args).__name__}.")
    if not callable(model_init):
        raise UserError(f"model_init must be a function returning a model, got {type(model_init).__name__}.")
    probe = call_user("model_init", model_init)
    if not isinstance(probe, torch.nn.Module):
        raise UserError(f"model_init returned {type(probe).__name__}, not a torch.nn.Module.")
    blocks = _blocks(probe)
    batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps
    collate = data_collator or transformers.default_data_collator

    def optimizer(params) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                                 eps=args.adam_epsilon, weight_decay=args.weight_decay)

    def loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        out = model(**batch) if isinstance(batch, dict) else model(batch)
        value = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
        if value is None:
            raise UserError("the model's output has no loss: the batch must hold `labels` (a data collator such as "
                            "DataCollatorForLanguageModeling(tokenizer, mlm=False) adds them).")
        return value

    return Workload(name=name or (args.run_name if args.run_name and args.run_name != args.output_dir else None)
                    or type(probe).__name__, model=model_init, dataset=train_dataset, optimizer=optimizer, loss=loss,
                    batch_size=batch_size, collate_fn=collate, checkpoint_blocks=blocks)
