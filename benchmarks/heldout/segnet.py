"""Semantic segmentation: a small U-Net on image/mask pairs augmented together in `__getitem__`.

What it is: the U-Net recipe at a CPU's size. Three encoder levels (two 3x3 conv + BatchNorm +
ReLU each, max-pool between), a bottleneck, and a decoder that upsamples with transposed
convolutions and concatenates the encoder's features (skip connections), then a 1x1 conv to
per-pixel class scores; loss = cross-entropy + soft Dice, as segmentation recipes combine
them; Adam. The data are synthetic 60x60 scenes held in memory as uint8 images and masks
(background plus ellipses and rectangles of three classes over textured noise); every
`__getitem__` applies the same random crop to 48x48, horizontal and vertical flips and a 90
degree rotation to image and mask, then jitters brightness and contrast and normalises the
image, as an albumentations pipeline would. Nothing is downloaded.

Measured on AMD EPYC (AVX2, no AVX-512/AMX), 2 cores, with `autotune profile
benchmarks/heldout/segnet.py --windows 3` on a machine shared with other jobs (load average
4): step median 639 ms, data 3%, forward 40%, backward 51%, optimizer 6%; Bottleneck: `sync`
(`F.one_hot` reads its input's minimum and maximum: two host syncs a step, free on a CPU),
ahead of compute at 97% of the step. Timed directly in one thread: about 80 ms a step.

    autotune profile benchmarks/heldout/segnet.py
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import autotune

CLASSES = 4  # background + three object kinds


# --- the model --------------------------------------------------------------------------------
def double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Up(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, kernel_size=2, stride=2)
        self.conv = double_conv(cin // 2 + cout, cout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([skip, self.up(x)], 1))


class UNet(nn.Module):
    def __init__(self, width: int = 8, classes: int = CLASSES) -> None:
        super().__init__()
        w = width
        self.enc1, self.enc2, self.enc3 = double_conv(3, w), double_conv(w, 2 * w), double_conv(2 * w, 4 * w)
        self.bottleneck = double_conv(4 * w, 8 * w)
        self.up3, self.up2, self.up1 = Up(8 * w, 4 * w), Up(4 * w, 2 * w), Up(2 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        e3 = self.enc3(F.max_pool2d(e2, 2))
        b = self.bottleneck(F.max_pool2d(e3, 2))
        return self.head(self.up1(self.up2(self.up3(b, e3), e2), e1))


def seg_loss(model: nn.Module, batch) -> torch.Tensor:
    """Cross-entropy + soft Dice over the object classes."""
    images, masks = batch
    logits = model(images)
    ce = F.cross_entropy(logits, masks)
    probs = logits.softmax(1)[:, 1:]
    onehot = F.one_hot(masks, CLASSES).permute(0, 3, 1, 2)[:, 1:].to(probs.dtype)
    inter = (probs * onehot).sum((0, 2, 3))
    dice = (2 * inter + 1) / (probs.sum((0, 2, 3)) + onehot.sum((0, 2, 3)) + 1)
    return ce + (1 - dice.mean())


# --- the data ---------------------------------------------------------------------------------
def synthetic_scenes(n: int, size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images [n, size, size, 3] and masks [n, size, size]: 2-5 shapes per scene."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    images = np.empty((n, size, size, 3), np.uint8)
    masks = np.zeros((n, size, size), np.uint8)
    colours = np.array([[200, 60, 60], [60, 200, 60], [70, 70, 210]])
    for i in range(n):
        img = rng.integers(60, 140) + rng.normal(0, 18, (size, size, 3))
        for _ in range(int(rng.integers(2, 6))):
            k = int(rng.integers(1, CLASSES))
            cy, cx = rng.integers(8, size - 8, 2)
            ry, rx = rng.integers(size // 12 + 1, size // 4 + 2, 2)
            inside = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1 if k != 2 else \
                (abs(yy - cy) <= ry) & (abs(xx - cx) <= rx)
            masks[i][inside] = k
            img[inside] = colours[k - 1] + rng.normal(0, 25, (int(inside.sum()), 3))
        images[i] = np.clip(img, 0, 255).astype(np.uint8)
    return images, masks


class Scenes(torch.utils.data.Dataset):
    MEAN, STD = torch.tensor([0.45, 0.42, 0.44]).view(3, 1, 1), torch.tensor([0.22, 0.22, 0.23]).view(3, 1, 1)

    def __init__(self, n: int, size: int = 60, crop: int = 48, seed: int = 0) -> None:
        self.images, self.masks = synthetic_scenes(n, size, seed)
        self.size, self.crop = size, crop

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        image = torch.from_numpy(self.images[i]).permute(2, 0, 1).float().div_(255)
        mask = torch.from_numpy(self.masks[i]).long()
        top, left = torch.randint(0, self.size - self.crop + 1, (2,)).tolist()
        image = image[:, top:top + self.crop, left:left + self.crop]
        mask = mask[top:top + self.crop, left:left + self.crop]
        if torch.rand(()) < 0.5:
            image, mask = image.flip(2), mask.flip(1)
        if torch.rand(()) < 0.5:
            image, mask = image.flip(1), mask.flip(0)
        k = int(torch.randint(0, 4, ()))
        image, mask = torch.rot90(image, k, (1, 2)), torch.rot90(mask, k, (0, 1))
        contrast, brightness = 1 + 0.4 * (float(torch.rand(())) - 0.5), 0.2 * (float(torch.rand(())) - 0.5)
        image = ((image - image.mean()) * contrast + image.mean() + brightness).clamp_(0, 1)
        return (image - self.MEAN) / self.STD, mask.contiguous()


def workload(n: int = 512, width: int = 8, crop: int = 48, batch_size: int = 16) -> autotune.Workload:
    return autotune.Workload(
        name="U-Net segmentation (paired augmentations)",
        model=lambda: UNet(width),
        dataset=lambda: Scenes(n, size=crop + crop // 4, crop=crop),
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-3),
        loss=seg_loss,
        batch_size=batch_size,
    )
