"""Keyword spotting: one-second clips, log-mel features computed in `__getitem__`, a small CNN.

What it is: the Speech Commands recipe at a CPU's size. Clips are 16 kHz mono int16 PCM held
in memory (as a folder of .wav files would be after reading); each `__getitem__` converts one
to float, shifts it by up to 100 ms, mixes in a slice of background noise at a random level,
and computes a 40-band log-mel spectrogram (25 ms Hann window, 10 ms hop, `torch.stft` and a
triangular mel filterbank, as `torchaudio.transforms.MelSpectrogram` would) with SpecAugment's
time and frequency masks. The model is a small VGG-style CNN over the 40 x 101 spectrogram
(three conv blocks with BatchNorm, global average pooling), 12 classes (10 keywords, "unknown",
"silence"), trained with Adam. The clips are synthetic: each keyword is two or three voiced
segments whose pitch and formants are the class's, with jitter per clip. Nothing is downloaded.

Measured on AMD EPYC (AVX2, no AVX-512/AMX), 2 cores, with `autotune profile
benchmarks/heldout/kws.py --windows 3` on a machine shared with other jobs (load average 4):
step median 1026 ms, data 45%, forward 22%, backward 30%, optimizer 4%; Bottleneck: `input`.
Timed directly on a quiet moment, a batch of 32 costs about 30 ms of feature extraction and
60 ms of training step with 2 threads (one thread: 23 and 87 ms).

    autotune profile benchmarks/heldout/kws.py
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import autotune

SAMPLE_RATE = 16_000
N_FFT, WIN, HOP, N_MELS = 512, 400, 160, 40
CLASSES = 12  # 10 keywords, "unknown", "silence"


# --- features -------------------------------------------------------------------------------
def mel_filterbank(n_mels: int = N_MELS, n_fft: int = N_FFT, sr: int = SAMPLE_RATE) -> torch.Tensor:
    """Triangular filters on the HTK mel scale, [n_fft // 2 + 1, n_mels]."""
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(20.0), hz_to_mel(sr / 2), n_mels + 2))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    fb = np.maximum(0.0, np.minimum((freqs - lower) / (centre - lower), (upper - freqs) / (upper - centre)))
    return torch.from_numpy(fb.T.astype(np.float32))


class LogMel:
    """waveform [T] -> log-mel spectrogram [1, n_mels, frames]."""

    def __init__(self) -> None:
        self.window = torch.hann_window(WIN)
        self.fb = mel_filterbank()

    def __call__(self, wave: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(wave, N_FFT, hop_length=HOP, win_length=WIN, window=self.window, center=True,
                          return_complex=True)
        power = spec.abs().pow_(2)  # [freq, frames]
        mel = self.fb.t() @ power  # [mels, frames]
        return torch.log(mel + 1e-6).unsqueeze(0)


def spec_augment(x: torch.Tensor, freq_mask: int = 6, time_mask: int = 12) -> torch.Tensor:
    """One frequency mask and one time mask of random width, filled with the mean."""
    _, n_mels, frames = x.shape
    fill = x.mean()
    f = int(torch.randint(0, freq_mask + 1, ()))
    f0 = int(torch.randint(0, n_mels - f + 1, ()))
    t = int(torch.randint(0, time_mask + 1, ()))
    t0 = int(torch.randint(0, frames - t + 1, ()))
    x[:, f0:f0 + f, :] = fill
    x[:, :, t0:t0 + t] = fill
    return x


# --- data -----------------------------------------------------------------------------------
def synthetic_clips(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[int], np.ndarray]:
    """`n` one-second int16 clips and labels, and 10 s of background noise. Keyword `c` is
    2-3 voiced segments at a pitch and two formants of its own; "silence" is noise only."""
    rng = np.random.default_rng(seed)
    plan = [(120 + 15 * c, 300 + 70 * c, 1100 + 150 * (c % 5), 2 + c % 2) for c in range(CLASSES)]
    clips, labels = [], rng.integers(0, CLASSES, n).tolist()
    floor = rng.normal(0, 0.01, 4 * SAMPLE_RATE).astype(np.float32)  # a quiet room, recorded once
    for c in labels:
        at = int(rng.integers(0, 3 * SAMPLE_RATE))
        wave = floor[at:at + SAMPLE_RATE].copy()
        if c != CLASSES - 1:  # the last class is silence
            pitch, f1, f2, segments = plan[c]
            start = int(rng.integers(1600, 4000))
            for _ in range(segments):
                dur = min(int(rng.integers(1900, 3500)), SAMPLE_RATE - start)
                t = np.arange(dur, dtype=np.float32) / SAMPLE_RATE
                env = np.hanning(dur)
                p = pitch * rng.uniform(0.9, 1.1)
                voiced = sum(np.sin(2 * np.pi * k * p * t) / k for k in range(1, 4))
                formants = np.sin(2 * np.pi * f1 * rng.uniform(0.95, 1.05) * t) + \
                    0.5 * np.sin(2 * np.pi * f2 * rng.uniform(0.95, 1.05) * t)
                wave[start:start + dur] += 0.3 * env * voiced * (1 + 0.5 * formants)
                start += dur + int(rng.integers(300, 1000))
        clips.append(np.clip(wave * 32767 * 0.5, -32768, 32767).astype(np.int16))
    noise = (rng.normal(0, 0.05, 10 * SAMPLE_RATE) * 32767).astype(np.int16)
    return clips, labels, noise


class SpeechCommandsLike(torch.utils.data.Dataset):
    """Clips as int16 PCM; features computed per sample, with time shift, background noise
    and SpecAugment, as the Speech Commands training recipes do."""

    def __init__(self, n: int, seed: int = 0, shift_ms: int = 100) -> None:
        self.clips, self.labels, self.noise = synthetic_clips(n, seed)
        self.shift = SAMPLE_RATE * shift_ms // 1000
        self.features = LogMel()

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int):
        wave = torch.from_numpy(self.clips[i].astype(np.float32) / 32768.0)
        shift = int(torch.randint(-self.shift, self.shift + 1, ()))
        wave = torch.roll(wave, shift)
        if shift > 0:
            wave[:shift] = 0
        elif shift < 0:
            wave[shift:] = 0
        start = int(torch.randint(0, len(self.noise) - SAMPLE_RATE, ()))
        noise = torch.from_numpy(self.noise[start:start + SAMPLE_RATE].astype(np.float32) / 32768.0)
        wave = wave + float(torch.rand(())) * 0.1 * noise
        x = self.features(wave)
        x = (x - x.mean()) / (x.std() + 1e-5)
        return spec_augment(x), self.labels[i]


# --- model ----------------------------------------------------------------------------------
def conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class KeywordCNN(nn.Module):
    def __init__(self, width: int = 8, classes: int = CLASSES, dropout: float = 0.2) -> None:
        super().__init__()
        self.features = nn.Sequential(conv_block(1, width), nn.MaxPool2d(2),
                                      conv_block(width, 2 * width), nn.MaxPool2d(2),
                                      conv_block(2 * width, 4 * width))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout),
                                  nn.Linear(4 * width, classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def workload(n: int = 1024, width: int = 8, batch_size: int = 32) -> autotune.Workload:
    return autotune.Workload(
        name="keyword spotting (log-mel in __getitem__)",
        model=lambda: KeywordCNN(width),
        dataset=lambda: SpeechCommandsLike(n),
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-3, weight_decay=1e-4),
        loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], label_smoothing=0.1),
        batch_size=batch_size,
    )

