"""A Transformer encoder classifying variable-length token sequences: the classic
BERT-style fine-tuning step, built from PyTorch's own `nn.TransformerEncoder`.

What it is: token and learned position embeddings, `nn.TransformerEncoder` (batch_first,
pre-LayerNorm `nn.TransformerEncoderLayer`s, dropout 0.1, a final LayerNorm), mean
pooling over the real tokens and a linear head; AdamW. The data are synthetic sequences
of `min_len` to `max_len` tokens (8 to 64 by default) generated once from a seed: each
class draws half its tokens from a band of the vocabulary of its own, the rest uniformly.
A `collate_fn` pads each batch to its longest sequence and builds the padding mask
(True = padding) that the encoder's attention and the pooling ignore. Nothing is downloaded.

Bottleneck on a 2-core CPU: `compute`. Measured on AMD EPYC (family 23, model 1: Zen 1,
AVX2, no AVX-512/AMX), 2 cores, with `autotune profile examples/transformer_encoder.py
--windows 3` on an otherwise idle machine:

    throughput 88.4 samples/s   step median 363.19 ms   windows 87, 90, 88 (CV 1.2%)
    data 0.2%, forward 53.7%, backward 43.3%, optimizer 2.6%
    Bottleneck: compute  (the step is spent in forward and no overhead rule fired)
      1. compute: 99.8% of the step

(That run had a vocabulary of 2000, since cut to 1000: the embedding is a negligible part
of the step. Two runs at 1000, under load from other processes: medians 351 and 362 ms,
forward 39-45%, backward 44-46%, same verdict.)

What a performance engineer would do: measure `torch.compile` first. bf16 autocast made
the step 7x *slower* here (2.5 s: no native bf16 on Zen 1; a win on AVX-512-BF16/AMX CPUs
and GPUs, so measure it, never assume). Padding is work too: a batch is as long as its
longest sequence, so 43% of these tokens are padding; bucketing sequences by
length (a sampler that batches similar lengths together) removes most of it. That is a
change to the data pipeline, not a knob, and it changes which samples share a batch, so
it is the user's call, not autotune's.

    autotune profile examples/transformer_encoder.py
    autotune tune examples/transformer_encoder.py --out runs/encoder
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import autotune

PAD = 0


class EncoderClassifier(nn.Module):
    def __init__(self, vocab_size: int, max_len: int, d_model: int, nhead: int, num_layers: int,
                 num_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=4 * d_model, dropout=dropout,
                                           batch_first=True, norm_first=True)
        # Pre-LayerNorm layers and a final LayerNorm: stable at lr 1e-3 without warm-up.
        # Nested tensors only ever apply in inference (and not with norm_first): off, so it
        # does not warn.
        self.encoder = nn.TransformerEncoder(layer, num_layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.encoder(self.tok(tokens) + self.pos(pos), src_key_padding_mask=pad_mask)
        keep = (~pad_mask).unsqueeze(-1).to(h.dtype)
        pooled = (h * keep).sum(1) / keep.sum(1)
        return self.head(pooled)


class TokenSequences(torch.utils.data.Dataset):
    """`n` sequences of `min_len`..`max_len` tokens (ids from 1; 0 is padding) with labels:
    class `c` draws a fraction `signal` of its tokens from its own band of the vocabulary."""

    def __init__(self, n: int, vocab_size: int, min_len: int, max_len: int, classes: int, signal: float = 0.5,
                 seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        band = (vocab_size - 1) // classes
        self.labels = rng.integers(0, classes, n).tolist()
        self.seqs = []
        for c in self.labels:
            length = int(rng.integers(min_len, max_len + 1))
            noise = rng.integers(1, vocab_size, length)
            own = 1 + c * band + rng.integers(0, band, length)
            self.seqs.append(torch.from_numpy(np.where(rng.random(length) < signal, own, noise)))

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int):
        return self.seqs[i], self.labels[i]


def pad_collate(samples):
    """Pad to the longest sequence in the batch; the mask is True where a token is padding."""
    seqs, labels = zip(*samples)
    tokens = torch.nn.utils.rnn.pad_sequence(list(seqs), batch_first=True, padding_value=PAD)
    lengths = torch.tensor([len(s) for s in seqs])
    pad_mask = torch.arange(tokens.shape[1]).unsqueeze(0) >= lengths.unsqueeze(1)
    return tokens, pad_mask, torch.tensor(labels)


def classify_loss(model: nn.Module, batch) -> torch.Tensor:
    tokens, pad_mask, labels = batch
    return F.cross_entropy(model(tokens, pad_mask), labels)


def workload(n: int = 4096, vocab_size: int = 1000, min_len: int = 8, max_len: int = 64, d_model: int = 128,
             nhead: int = 4, num_layers: int = 4, classes: int = 4, batch_size: int = 32) -> autotune.Workload:
    """`num_layers` encoder layers of width `d_model` over sequences of up to `max_len`."""
    return autotune.Workload(
        name=f"transformer encoder ({num_layers}x{d_model}, padded to <= {max_len})",
        model=lambda: EncoderClassifier(vocab_size, max_len, d_model, nhead, num_layers, classes),
        dataset=lambda: TokenSequences(n, vocab_size, min_len, max_len, classes),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
        loss=classify_loss,
        batch_size=batch_size,
        collate_fn=pad_collate,
        checkpoint_blocks=(nn.TransformerEncoderLayer,),
    )


def small() -> autotune.Workload:
    """For tests: 2 layers of width 64, sequences of 8 to 32 tokens."""
    return workload(n=512, vocab_size=200, min_len=8, max_len=32, d_model=64, nhead=2, num_layers=2, batch_size=16)
