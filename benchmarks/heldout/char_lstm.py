"""A character-level language model: an LSTM over lines of text of varying length.

What it is: the classic char-RNN. Each sample is one line of text (16 to 96 characters),
encoded to character ids in `__getitem__`; a `collate_fn` sorts nothing and pads each batch to
its longest line (`pad_sequence`), with the targets shifted by one and padded with -100 so
that the loss ignores them. The model embeds characters, runs a two-layer `nn.LSTM` over the
padded batch and predicts the next character; Adam, as char-RNN recipes use. The batch is not
packed: a left-to-right model's outputs at real positions never see the padding after them,
and a packed batch's backward was 4x slower on a CPU here (the fused LSTM kernel runs on padded
tensors only). The text is synthetic: lines of made-up words
drawn with Zipf frequencies from a vocabulary of syllables, with punctuation, numbers and
capitals, generated once from a seed. Nothing is downloaded.

The step's length follows its batch's longest line, so step times vary from batch to batch.

Measured on AMD EPYC (AVX2, no AVX-512/AMX), 2 cores, with `autotune profile
benchmarks/heldout/char_lstm.py --windows 3` on a machine shared with other jobs (load average
4-5): step median 863 ms, windows 14, 40, 40 samples/s, data 0.4%, forward 40%, backward 57%;
Bottleneck: `compute`. Timed directly on a quiet moment: about 90 ms a step with 2 threads
(one thread: 117 ms).

    autotune profile benchmarks/heldout/char_lstm.py
"""

from __future__ import annotations

import string

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

import autotune

PAD, IGNORE = 0, -100
ALPHABET = string.ascii_letters + string.digits + string.punctuation + " "
STOI = {c: i + 1 for i, c in enumerate(ALPHABET)}  # 0 is padding
VOCAB = len(STOI) + 1


def synthetic_lines(n: int, min_len: int = 16, max_len: int = 96, seed: int = 0) -> list[str]:
    """`n` lines of made-up words (Zipf-distributed over 2,000 words of 1-4 syllables)."""
    rng = np.random.default_rng(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + ["th", "ch", "st", "er", "ing", "ed"]
    words = ["".join(rng.choice(syllables, int(rng.integers(1, 5)))) for _ in range(2000)]
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    lines = []
    drawn = iter(rng.choice(len(words), size=n * max_len // 3, p=weights).tolist())  # enough words for every line
    for _ in range(n):
        target = int(rng.integers(min_len, max_len + 1))
        parts: list[str] = []
        size = 0
        while size < target:
            w = words[next(drawn)]
            if not parts or parts[-1].endswith("."):
                w = w.capitalize()
            r = rng.random()
            if r < 0.05:
                w = str(int(rng.integers(0, 10_000)))
            elif r < 0.12:
                w += "," if r < 0.09 else "."
            parts.append(w)
            size += len(w) + 1
        lines.append(" ".join(parts)[:target])
    return lines


class Lines(torch.utils.data.Dataset):
    """Lines of text; each sample is (input ids, next-character ids)."""

    def __init__(self, n: int, max_len: int = 96, seed: int = 0) -> None:
        self.lines = synthetic_lines(n, max_len=max_len, seed=seed)

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int):
        ids = torch.tensor([STOI.get(c, STOI[" "]) for c in self.lines[i]], dtype=torch.long)
        return ids[:-1], ids[1:]


def pad_collate(samples):
    """Pad inputs with PAD and targets with IGNORE to the batch's longest line."""
    inputs, targets = zip(*samples)
    return (pad_sequence(list(inputs), batch_first=True, padding_value=PAD),
            pad_sequence(list(targets), batch_first=True, padding_value=IGNORE))


class CharLSTM(nn.Module):
    def __init__(self, vocab: int = VOCAB, embed: int = 64, hidden: int = 128, layers: int = 2,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed, padding_idx=PAD)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True, dropout=dropout)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(ids))  # padding sits after every real position: it cannot leak back
        return self.out(self.drop(h))


def lm_loss(model: nn.Module, batch) -> torch.Tensor:
    ids, targets = batch
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def workload(n: int = 4096, max_len: int = 96, hidden: int = 128, batch_size: int = 32) -> autotune.Workload:
    return autotune.Workload(
        name="char LSTM (variable-length lines)",
        model=lambda: CharLSTM(hidden=hidden),
        dataset=lambda: Lines(n, max_len),
        optimizer=lambda params: torch.optim.Adam(params, lr=2e-3),
        loss=lm_loss,
        batch_size=batch_size,
        collate_fn=pad_collate,
    )
