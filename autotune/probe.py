"""How much faster this CPU multiplies in lower precision: the amp recipe's prior, measured.

A CPU with bf16 units runs bf16 autocast faster than fp32; one without them emulates it, far
slower (fp16 is emulated on most CPUs). One matrix product per dtype and fp32's, timed in turns at their best of up to
40 (a neighbour's burst only slows some), says which lower precision this machine has
units for, in under a second. The step decides whether it pays: a dtype at least
`FAST_UNITS` faster is searched for speed, one that is not is left out of the speed
search (it still saves memory, so a memory search keeps it). CUDA devices are not
probed (their bf16/fp16 units are the rule; the config already refuses bf16 where a GPU
has none): the recipe file's prior stands.
"""

from __future__ import annotations

import time

import torch

__all__ = ["FAST_UNITS", "KEY", "PRIOR_CAP", "amp_prior", "fast", "lowp_matmul", "text"]

KEY = "precision.amp"  # the knob the probe speaks for, in any recipe that searches it
# A dtype's matmuls at least this much faster than fp32's: the hardware has units for it (an
# emulated dtype reads near 1x, and timing noise under load alone can read past 1.2x).
FAST_UNITS = 1.5
PRIOR_CAP = 2.0  # a step gains less than its matmuls do (casts, ops autocast leaves in fp32)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SIZE = 512
REPEATS = 40  # best of many: a neighbour's burst slows only some of them, and a few vary widely
TIME_S = 0.3  # at most this long per dtype after the first products (an emulated dtype: a few)


def _ratio(dtype: torch.dtype) -> float:
    """fp32's best time for one product over `dtype`'s, the two timed in turns (a burst
    or a clock change hits both alike)."""
    g = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(SIZE, SIZE, generator=g), torch.randn(SIZE, SIZE, generator=g)
    a, b = a32.to(dtype), b32.to(dtype)
    for _ in range(2):  # the first products pick and load the kernels, wake the threads
        torch.mm(a32, b32), torch.mm(a, b)
    best = {torch.float32: float("inf"), dtype: float("inf")}
    start = time.perf_counter()
    for _ in range(REPEATS):
        for d, (x, y) in ((torch.float32, (a32, b32)), (dtype, (a, b))):
            t0 = time.perf_counter()
            torch.mm(x, y)
            best[d] = min(best[d], time.perf_counter() - t0)
        if time.perf_counter() - start > TIME_S:
            break
    return best[torch.float32] / best[dtype]


def lowp_matmul(device: torch.device) -> dict[str, float]:
    """Each lower precision's matrix-product throughput over fp32's on `device` (CPU only;
    empty where it is not measured)."""
    if device.type != "cpu":
        return {}
    out = {}
    for name, dtype in DTYPES.items():
        try:
            out[name] = round(_ratio(dtype), 3)
        except RuntimeError:  # no kernel for this dtype here
            out[name] = 0.0
    return out


def fast(lowp: dict[str, float]) -> set[str]:
    """The precisions this machine has units for; every one where nothing was measured."""
    return set(DTYPES) if not lowp else {k for k, v in lowp.items() if v >= FAST_UNITS}


def amp_prior(lowp: dict[str, float], default: float) -> float:
    """The compute speedup to expect of autocast: the best fast dtype's measured matmul
    speedup (capped), 1.0 (none) when no dtype is fast, `default` when not measured."""
    if not lowp:
        return default
    best = max((v for k, v in lowp.items() if k in fast(lowp)), default=None)
    return min(best, PRIOR_CAP) if best is not None else 1.0


def text(lowp: dict[str, float]) -> str:
    """The probe's figures in words, e.g. "bf16 3x, fp16 0.97x"."""
    return ", ".join(f"{k} {v:.2g}x" for k, v in lowp.items())
