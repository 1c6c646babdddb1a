"""A Hugging Face causal LM built from a config (no download), tuned as `transformers.Trainer`
would train it: `autotune.integrations.hf.workload` takes model_init, the dataset, the data
collator and the TrainingArguments. Needs `transformers` (`pip install 'autotune[hf]'`).

    autotune profile examples/hf_tiny.py
    autotune tune examples/hf_tiny.py --out runs/hf
    autotune export runs/hf --to hf --batch-size 16
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from autotune.integrations.hf import workload as from_hf

VOCAB, SEQ = 256, 32


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, each its own label (the model shifts them)."""

    def __init__(self, n: int = 512):
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def model_init():
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2)
    return GPT2LMHeadModel(config)


def workload():
    args = TrainingArguments(output_dir="autotune-hf", per_device_train_batch_size=16, learning_rate=3e-4,
                             weight_decay=0.01, report_to=[], use_cpu=True)
    return from_hf(model_init, Tokens(), args=args, name="hf tiny gpt2")


def small():
    return workload()
