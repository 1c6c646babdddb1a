"""ResNet-18 image classification on JPEG files: the classic vision training step.

What it is: a ResNet-18 written out here in torchvision's layout (7x7 stem, max-pool,
BasicBlocks [2, 2, 2, 2], no pretrained weights; at half torchvision's width by default,
32-256 channels, to keep a CPU step short), trained with SGD and momentum on 10 classes
of synthetic 72x72 images cropped to 64x64. The images are generated once from a seed
(a shape in a colour per class over a noisy grey background) and kept as JPEG bytes, as a folder
of .jpg files or a webdataset shard would hold them; every `__getitem__` decodes one with
PIL, then takes a random crop, a random horizontal flip and normalises, as
`torchvision.transforms` `RandomCrop`/`RandomHorizontalFlip`/`ToTensor`/`Normalize` would.
Nothing is downloaded.

Bottleneck on a 2-core CPU: mostly `compute`, with decoding just past the `input` rule.
Measured on AMD EPYC (family 23, model 1: Zen 1, AVX2, no AVX-512/AMX), 2 cores, with
`autotune profile examples/resnet_jpeg.py --windows 3` on an otherwise idle machine:

    throughput 129.5 samples/s   step median 248.42 ms   windows 126, 126, 137 (CV 3.9%)
    data 21.4 ms (8.7%), forward 31.3%, backward 56.7%, optimizer 3.3%
    Bottleneck: input  (the step waits for data 9% of the step (> 5%))
      1. input: 8.7% of the step, a fix gains at most 1.09x
      2. compute: 91.3% of the step

Decoding, cropping and normalising cost about 0.6 ms per image here, 20 ms per batch of
32, against about 225 ms of convolutions: the verdict is `input`, but the most that
fixing it can give is 1.09x. (With other processes busy on the same cores, compute slows
down more than decoding and the same example reads `compute`, data 2.6%.)

What a performance engineer would do: take the input verdict's bound seriously. Workers
take decoding out of the step, but on 2 cores each one also takes a core from the
convolutions: measured, one worker gave 1.03x (within noise). The step is convolutions,
so the compute recipes matter more: `channels_last` (the model has convolutions; oneDNN's
NHWC kernels) gave 1.16x in a quick interleaved check here (two 5-step windows
each, not autotune's protocol); `torch.compile` is worth
measuring; bf16 autocast was 16x *slower* here (3.3 s a step: no native bf16 on Zen 1)
but is a win on CPUs with AVX-512-BF16 or AMX and on GPUs, so measure it, never assume.
On a GPU the picture flips: host JPEG decoding is the classic input bottleneck there, and
workers (or GPU decoding) come first.

    autotune profile examples/resnet_jpeg.py
    autotune tune examples/resnet_jpeg.py --out runs/resnet
"""

from __future__ import annotations

import io

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import autotune

# ImageNet's per-channel statistics, as torchvision's Normalize is usually given them.
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


# --- the model: torchvision's resnet18 layout ---------------------------------------------
def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1, self.bn1 = conv3x3(cin, cout, stride), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = conv3x3(cout, cout), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers=(2, 2, 2, 2), width: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        stages, cin = [], width
        for i, n in enumerate(layers):
            cout = width * 2**i
            blocks = [BasicBlock(cin, cout, stride=1 if i == 0 else 2)]
            blocks += [BasicBlock(cout, cout) for _ in range(n - 1)]
            stages.append(nn.Sequential(*blocks))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(width: int = 64, num_classes: int = 10) -> ResNet:
    return ResNet((2, 2, 2, 2), width, num_classes)


# --- the data: JPEG bytes, decoded and augmented per sample -------------------------------
def synthetic_jpegs(n: int, size: int, classes: int = 10, seed: int = 0, quality: int = 90):
    """`n` JPEG-encoded RGB images of `size`x`size` and their labels: class `c` is a shape
    (ellipse, rectangle or triangle) of a class colour at a random place and size, over a
    noisy grey background. Deterministic for a seed."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        raise ImportError("the ResNet example encodes and decodes JPEGs with Pillow: "
                          "pip install pillow (or 'autotune[examples]')") from None

    rng = np.random.default_rng(seed)
    hues = [(np.array([np.cos(a), np.cos(a - 2.1), np.cos(a + 2.1)]) * 100 + 140).astype(int)
            for a in np.linspace(0, 2 * np.pi, classes, endpoint=False)]
    labels = rng.integers(0, classes, n).tolist()
    blobs = []
    for c in labels:
        grey = rng.integers(40, 216)
        pixels = np.clip(grey + rng.normal(0, 25, (size, size, 3)), 0, 255).astype(np.uint8)
        img = Image.fromarray(pixels, "RGB")
        draw = ImageDraw.Draw(img)
        r = int(rng.integers(size // 3, 2 * size // 3))
        x0, y0 = (int(v) for v in rng.integers(0, size - r, 2))
        box = (x0, y0, x0 + r, y0 + r)
        colour = tuple(int(v) for v in np.clip(hues[c] + rng.integers(-20, 21, 3), 0, 255))
        shape = c % 3
        if shape == 0:
            draw.ellipse(box, fill=colour)
        elif shape == 1:
            draw.rectangle(box, fill=colour)
        else:
            draw.polygon([(x0, y0 + r), (x0 + r, y0 + r), (x0 + r // 2, y0)], fill=colour)
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=quality)
        blobs.append(buf.getvalue())
    return blobs, labels


class JpegFolder(torch.utils.data.Dataset):
    """Images held as JPEG bytes (as files on disk would hold them), decoded with PIL per
    sample, then RandomCrop(crop) + RandomHorizontalFlip + ToTensor + Normalize."""

    def __init__(self, n: int, size: int, crop: int, classes: int = 10, seed: int = 0) -> None:
        self.blobs, self.labels = synthetic_jpegs(n, size, classes, seed)
        self.size, self.crop = size, crop

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):
        from PIL import Image

        with Image.open(io.BytesIO(self.blobs[i])) as img:
            pixels = np.array(img.convert("RGB"), dtype=np.uint8)  # H, W, C
        # torchvision's transforms draw from torch's generator (seeded per worker).
        top, left = torch.randint(0, self.size - self.crop + 1, (2,)).tolist()
        pixels = pixels[top:top + self.crop, left:left + self.crop]
        if torch.rand(()) < 0.5:
            pixels = pixels[:, ::-1]
        x = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1).float().div_(255)
        return (x - MEAN) / STD, self.labels[i]


def workload(n: int = 1536, size: int = 72, crop: int = 64, width: int = 32, batch_size: int = 32) -> autotune.Workload:
    """ResNet-18 on `crop`x`crop` crops of `size`x`size` JPEGs. `width` 64 is torchvision's
    (11.2M parameters, about 4x the compute); the default 32 (2.8M) keeps a step on a
    2-core CPU in the hundreds of milliseconds."""
    return autotune.Workload(
        name="resnet18 (JPEG decode + augment)",
        model=lambda: resnet18(width),
        dataset=lambda: JpegFolder(n, size, crop),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.02, momentum=0.9, weight_decay=5e-4),
        loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
        batch_size=batch_size,
        checkpoint_blocks=(BasicBlock,),
    )


def small() -> autotune.Workload:
    """For tests: a quarter-width ResNet-18 on 32x32 crops, 256 images."""
    return workload(n=256, size=36, crop=32, width=16, batch_size=16)
