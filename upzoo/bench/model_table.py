"""The model table of ``upzoo bench model``: a recipe's model at one input — FPS, forward and
training-step time, peak memory, parameters and FLOPs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from upzoo.bench.memory import ensure_fits, estimate_training_bytes, peak_memory
from upzoo.bench.speed import measure_fps

__all__ = ["bench_model"]


def bench_model(
    model: nn.Module,
    input_shape: Sequence[int],
    *,
    device: str = "cpu",
    runs: int = 10,
    amp: str = "none",
    channels_last: bool = False,
) -> dict[str, Any]:
    """FPS (inference) and peak memory of inference and of a training step, with and without gradient
    checkpointing where the model supports it; ``amp`` and ``channels_last`` apply to every pass."""
    import torch.nn.functional as F

    from upzoo.runtime import autocast, main_output

    autocast(amp, torch.device(device), "--amp")  # fp16 on the CPU: refused before any work
    ensure_fits(estimate_training_bytes(model, tuple(input_shape)), f"a training step at input {tuple(input_shape)}")
    fps = measure_fps(model, tuple(input_shape), device=device, iters=runs, amp=amp, channels_last=channels_last)
    x = torch.rand(*input_shape, device=device)  # in [0, 1]: what image models take
    if channels_last:  # measure_fps converted the model
        x = x.contiguous(memory_format=torch.channels_last if x.ndim == 4 else torch.channels_last_3d)
    model.to(device)

    def infer():
        with torch.inference_mode(), autocast(amp, torch.device(device)):
            model.eval()(x)

    segmentation = hasattr(model, "num_classes") or hasattr(model, "segmentation_head")

    def train_step():
        model.train()
        with autocast(amp, torch.device(device)):
            out = model(x)
        out = main_output(out)
        if segmentation:
            target = torch.zeros(out.shape[0], *out.shape[2:], dtype=torch.long, device=device)
            F.cross_entropy(out.float(), target).backward()
        else:  # a generator: any scalar of its output exercises the same backward
            out.float().square().mean().backward()
        model.zero_grad(set_to_none=True)

    def measured(fn) -> float:
        fn()  # warm-up: lazy initialisation and first-call allocations out of the measurement
        return max(peak_memory(fn, device=device).mib for _ in range(2))

    result = {
        **fps,
        "peak_inference_mib": measured(infer),
        "peak_train_mib": measured(train_step),
        "memory_method": peak_memory(lambda: None, device=device).method,
    }
    if hasattr(model, "checkpointing"):
        previous = model.checkpointing
        model.checkpointing = True
        try:
            result["peak_train_checkpointing_mib"] = measured(train_step)
        finally:
            model.checkpointing = previous
    result["params"] = sum(p.numel() for p in model.parameters())
    return result
