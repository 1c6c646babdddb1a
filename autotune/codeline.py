"""The plain PyTorch code line that applies one tuned key, for export targets without a setting for it."""

from __future__ import annotations

from typing import Any

from .apply import tf32_code

__all__ = ["code_line"]

_DTYPE = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


def code_line(key: str, value: Any, device: str = "cuda", accumulation: int | None = None) -> str:
    """The PyTorch code that applies one tuned key, for targets that have no setting for it."""
    if key.startswith("data.") and key != "data.non_blocking":
        return f"DataLoader(..., {key.split('.', 1)[1]}={value!r})"
    if key == "data.non_blocking":
        return "batch = batch.to(device, non_blocking=True)" if value else "batch = batch.to(device)"
    if key == "precision.amp":
        if value == "none":
            return "no autocast (full precision)"
        line = f"with torch.autocast({device!r}, dtype={_DTYPE[value]}): loss = ..."
        return line + ("; scaler = torch.amp.GradScaler()" if value == "fp16" else "")
    if key == "precision.tf32":
        return tf32_code(value)
    if key == "compile.mode":
        if value == "none":
            return "no torch.compile"
        return "model = torch.compile(model)" if value == "default" else f"model = torch.compile(model, mode={value!r})"
    if key == "memory.micro_batch_size":
        steps = f"{accumulation}" if accumulation else "global_batch // micro_batch"
        return (f"micro-batches of {value}: DataLoader(..., batch_size={value}), (loss / {steps}).backward() on each, "
                f"optimizer.step() every {steps} micro-batches")
    if key == "memory.activation_checkpointing":
        return ("x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) for each block "
                "(Hugging Face models: model.gradient_checkpointing_enable())")
    if key == "layout.channels_last":
        return "model = model.to(memory_format=torch.channels_last); x = x.to(memory_format=torch.channels_last)"
    if key == "attention.backend":
        if value == "default":
            return "PyTorch's own choice of attention kernel per call"
        return (f"with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.{value}): loss = ...  "
                "(around the forward pass)")
    if key == "optimizer.impl":
        return f"torch.optim.AdamW(model.parameters(), ..., {value}=True)" if value != "default" else "default optimizer"
    if key == "backend.cudnn_benchmark":
        return f"torch.backends.cudnn.benchmark = {value}"
    if key == "backend.num_threads":
        return f"torch.set_num_threads({value})  (or OMP_NUM_THREADS={value} in the environment)"
    if key.startswith("distributed."):
        name = key.split(".", 1)[1]
        return f"torchrun --nproc_per_node={value} train.py" if name == "world_size" else \
            f"model = DistributedDataParallel(model, ..., {name}={value!r})"
    return f"{key} = {value!r}"
