"""A small GPT language model, nanoGPT-style: the classic decoder-only training step.

What it is: token and position embeddings, `n_layer` pre-LayerNorm blocks (causal
self-attention through `F.scaled_dot_product_attention`, then a 4x GELU MLP), a final
LayerNorm and a head tied to the token embedding; AdamW as nanoGPT configures it (betas
0.9/0.95, weight decay 0.1 on the >= 2-D parameters only). It learns next-token prediction
on windows of a synthetic corpus generated once from a seed: a token stream from a sparse
Markov chain (each token has a few likely successors), so the loss falls from ln(vocab)
towards the chain's entropy. Nothing is downloaded.

Bottleneck on a 2-core CPU: `compute`. Measured on AMD EPYC (family 23, model 1: Zen 1,
AVX2, no AVX-512/AMX), 2 cores, with `autotune profile examples/gpt.py --windows 3`:

    throughput 37.7 samples/s   step median 290.90 ms   windows 54, 53, 24 samples/s
    data 0.1%, forward 27.5%, backward 61.1%, optimizer 11.2%
    Bottleneck: compute  (the step is spent in backward and no overhead rule fired)
      1. compute: 99.9% of the step

(The third window was slowed by another process on the same cores; a second run gave a
307 ms median and the same verdict.) About 860 ops per step averaging ~1 ms: matrix
multiplies, not dispatch overhead.

What a performance engineer would do: the step is the matrix multiplies of attention, the
MLP and the vocabulary head; the data is a tensor slice. `torch.compile` (fuses LayerNorm,
GELU and the residual adds) is the lever worth measuring. Measured here in quick
interleaved checks (two 5-step windows each, not autotune's protocol): bf16 autocast made
the step 10x *slower* (3.0 s: no native bf16 on Zen 1; it is a win on CPUs with
AVX-512-BF16 or AMX and on GPUs, so measure it, never assume), and a `foreach` or `fused`
AdamW changed nothing (1.00x, 1.02x). Activation checkpointing of `Block` and
micro-batching trade speed for memory: they are for when a longer context or a bigger
batch no longer fits.

    autotune profile examples/gpt.py
    autotune tune examples/gpt.py --out runs/gpt
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import autotune


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(n_embd), CausalSelfAttention(n_embd, n_head)
        self.ln_2, self.mlp = nn.LayerNorm(n_embd), MLP(n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def adamw(params, lr: float = 1e-3, weight_decay: float = 0.1) -> torch.optim.AdamW:
    """nanoGPT's optimizer: weight decay on matrices and embeddings (>= 2-D), none on
    biases and LayerNorm weights."""
    params = [p for p in params if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


class MarkovCorpus(torch.utils.data.Dataset):
    """A token stream of `n_tokens` from a random sparse Markov chain (each token is followed
    by one of `fanout` successors, with skewed probabilities), served as (input, target)
    windows of `block_size` at every offset, as nanoGPT samples them."""

    def __init__(self, n_tokens: int, vocab_size: int, block_size: int, fanout: int = 4, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        successors = rng.integers(0, vocab_size, (vocab_size, fanout))
        weights = 1.0 / np.arange(1, fanout + 1)
        picks = rng.choice(fanout, size=n_tokens, p=weights / weights.sum())
        stream = np.empty(n_tokens, dtype=np.int64)
        tok = 0
        table = successors.tolist()
        for i, k in enumerate(picks.tolist()):
            tok = table[tok][k]
            stream[i] = tok
        self.data = torch.from_numpy(stream)
        self.block_size = block_size

    def __len__(self) -> int:
        return len(self.data) - self.block_size - 1

    def __getitem__(self, i: int):
        chunk = self.data[i:i + self.block_size + 1]
        return chunk[:-1], chunk[1:]


def lm_loss(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def workload(vocab_size: int = 1024, block_size: int = 128, n_layer: int = 4, n_head: int = 4, n_embd: int = 128,
             batch_size: int = 16, n_tokens: int = 200_000) -> autotune.Workload:
    """A GPT of `n_layer` x `n_embd` (default 0.93M parameters) at context `block_size`."""
    return autotune.Workload(
        name=f"gpt ({n_layer}x{n_embd}, context {block_size})",
        model=lambda: GPT(vocab_size, block_size, n_layer, n_head, n_embd),
        dataset=lambda: MarkovCorpus(n_tokens, vocab_size, block_size),
        optimizer=adamw,
        loss=lm_loss,
        batch_size=batch_size,
        checkpoint_blocks=(Block,),
    )


def small() -> autotune.Workload:
    """For tests: 2 layers of width 64, context 32."""
    return workload(vocab_size=128, block_size=32, n_layer=2, n_head=2, n_embd=64, batch_size=8, n_tokens=20_000)
