"""A small Vision Transformer on 32x32 images: patch embedding, pre-norm blocks, AdamW.

What it is: the ViT recipe for CIFAR-sized images, written as timm writes it. A strided
convolution cuts a 32x32 image into 64 patches of 4x4 and embeds each; a class token and
learned position embeddings are added; three pre-LayerNorm transformer blocks (multi-head
self-attention through `F.scaled_dot_product_attention`, an MLP with GELU, both residual)
and a final LayerNorm; the class token goes to a linear head. AdamW with weight decay on the
weights only (not on biases, norms, tokens or position embeddings), as ViT training does.
The images are synthetic and held in memory as uint8 (a class-coloured stripe pattern at a
random angle over noise, 10 classes); `__getitem__` takes a random crop from the image
padded by 4 and a random horizontal flip, then normalises, as the CIFAR recipes do. Nothing
is downloaded.

Measured on AMD EPYC (AVX2, no AVX-512/AMX), 2 cores, with `autotune profile
benchmarks/heldout/vit_small.py --windows 3` on a machine shared with other jobs (load average
4): step median 601 ms, data 7%, forward 28%, backward 58%, optimizer 7%; Bottleneck: `input`
(the per-sample pad, crop and flip just past the rule's 5%). Timed directly in one thread:
about 80 ms a step and 3 ms of data a batch.

    autotune profile benchmarks/heldout/vit_small.py
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import autotune

MEAN = torch.tensor([0.49, 0.48, 0.45]).view(3, 1, 1)
STD = torch.tensor([0.25, 0.24, 0.26]).view(3, 1, 1)


# --- the model --------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float = 2.0) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, image: int = 32, patch: int = 4, dim: int = 96, depth: int = 3, heads: int = 3,
                 classes: int = 10) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        n = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # [B, patches, dim]
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


def adamw(params, lr: float = 1e-3, weight_decay: float = 0.05) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and kernels only (not biases, norms, the class
    token or the position embeddings: the tensors whose first dimension is 1)."""
    params = list(params)
    decay = [p for p in params if p.ndim >= 2 and p.shape[0] != 1]
    rest = [p for p in params if not (p.ndim >= 2 and p.shape[0] != 1)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.999))


# --- the data ---------------------------------------------------------------------------------
class StripedImages(torch.utils.data.Dataset):
    """uint8 images [n, 32, 32, 3]; random crop (pad 4) + horizontal flip + normalise per sample."""

    def __init__(self, n: int, size: int = 32, classes: int = 10, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, classes, n)
        yy, xx = np.mgrid[0:size, 0:size] / size
        angle = rng.uniform(0, np.pi, (n, 1, 1))
        freq = (2 + self.labels % 5)[:, None, None] * 2 * np.pi
        stripes = np.sin(freq * (np.cos(angle) * xx + np.sin(angle) * yy) + rng.uniform(0, 6.3, (n, 1, 1)))
        hue = np.stack([np.cos(a + np.array([0, 2.1, 4.2])) for a in np.linspace(0, 6.3, classes)])[self.labels]
        pixels = 128 + 60 * stripes[..., None] * hue[:, None, None, :] + rng.normal(0, 20, (n, size, size, 3))
        self.images = np.clip(pixels, 0, 255).astype(np.uint8)
        self.labels = self.labels.tolist()
        self.size = size

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = torch.from_numpy(self.images[i]).permute(2, 0, 1).float().div_(255)
        x = F.pad(x, (4, 4, 4, 4), mode="reflect")
        top, left = torch.randint(0, 9, (2,)).tolist()
        x = x[:, top:top + self.size, left:left + self.size]
        if torch.rand(()) < 0.5:
            x = x.flip(2)
        return (x - MEAN) / STD, self.labels[i]


def workload(n: int = 2048, dim: int = 96, depth: int = 3, batch_size: int = 32) -> autotune.Workload:
    return autotune.Workload(
        name="ViT (4x4 patches, 32x32 images)",
        model=lambda: ViT(dim=dim, depth=depth, heads=max(1, dim // 32)),
        dataset=lambda: StripedImages(n),
        optimizer=adamw,
        loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], label_smoothing=0.1),
        batch_size=batch_size,
        checkpoint_blocks=(Block,),
    )
