"""The comparison tables: every block (parameters, FLOPs, time, memory, checkerboard) and a recipe's
model (FPS, memory). Upsamplers trained side by side with seeds: :mod:`upzoo.bench.evidence`."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from upzoo.bench.artifacts import checkerboard_score, smooth_field
from upzoo.bench.memory import ensure_fits, estimate_training_bytes, peak_memory
from upzoo.bench.speed import environment, measure_fps, time_call
from upzoo.errors import ShapeError
from upzoo.registry import UPSAMPLERS, create_upsampler, list_upsamplers

__all__ = ["count_flops", "bench_blocks", "bench_model", "BLOCK_COLUMNS"]

BLOCK_COLUMNS = ["block", "params", "gflops", "forward_ms", "fwd_bwd_ms", "peak_mib", "checkerboard"]


def count_flops(module: nn.Module, x: torch.Tensor) -> int:
    """Floating-point operations of one forward pass, by PyTorch's FlopCounterMode (convolutions and
    matrix products; element-wise ops and grid_sample are not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(x)
    return int(counter.get_total_flops())


class GuidedByFixedFeature(nn.Module):
    """A guided block fed one fixed smooth guide per input shape (the skip a U-Net would pass), so
    the block tables measure it like every other block: ``forward(x)``. ``wrap`` leaves unguided
    blocks as they are."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block, self.scale = block, block.scale
        self._guides: dict[tuple[int, ...], torch.Tensor] = {}

    @classmethod
    def wrap(cls, block: nn.Module) -> nn.Module:
        return cls(block) if getattr(block, "needs_guide", False) else block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = tuple(x.shape)
        if key not in self._guides:
            shape = (x.shape[0], self.block.guide_channels, *self.block.output_spatial(tuple(x.shape[2:])))
            self._guides[key] = smooth_field(shape, seed=1).to(x)
        return self.block(x, self._guides[key])


def check_block_input(shape: Sequence[int]) -> None:
    """Raises ShapeError unless ``shape`` is ``(B, C, H, W)`` or ``(B, C, D, H, W)`` of positive sizes."""
    if len(shape) not in (4, 5) or min(shape) < 1:
        raise ShapeError(
            f"bench blocks takes an input (B, C, H, W) or (B, C, D, H, W) of positive sizes, "
            f"got {tuple(shape)}; e.g. 8x64x64x64"
        )


def bench_blocks(
    shape: Sequence[int] = (8, 64, 64, 64),
    *,
    scale: int | Sequence[int] = 2,
    device: str = "cpu",
    runs: int = 5,
    names: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per registered upsampler (that supports the input's dims) at the same input and scale.

    Raises:
        ShapeError: a shape that is not ``(B, C, H, W)`` or ``(B, C, D, H, W)``, or a block that would
            not fit in the free memory at this shape (estimated on the meta device first).
    """
    check_block_input(shape)
    dims = len(shape) - 2
    rows = []
    for name in names or list_upsamplers(kind="upsampler"):
        info = UPSAMPLERS.info(name)
        if dims not in info.spatial_dims:
            continue
        if progress:
            progress(name)
        guide = {"guide_channels": shape[1]} if info.needs_guide else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.device("meta"):
                meta = GuidedByFixedFeature.wrap(
                    create_upsampler(
                        name, spatial_dims=dims, in_channels=shape[1], out_channels=shape[1], scale=scale, **guide
                    )
                )
            ensure_fits(estimate_training_bytes(meta, tuple(shape)), f"block {name} at input {tuple(shape)}")
            block = GuidedByFixedFeature.wrap(
                create_upsampler(
                    name, spatial_dims=dims, in_channels=shape[1], out_channels=shape[1], scale=scale, **guide
                ).to(device)
            )
        x = torch.randn(*shape, device=device)
        x_grad = x.clone().requires_grad_(True)

        def fwd_bwd():
            y = block(x_grad)
            y.backward(torch.ones_like(y))

        with torch.no_grad():
            forward = time_call(lambda: block(x), warmup=2, runs=runs, device=device)
        both = time_call(fwd_bwd, warmup=2, runs=runs, device=device)
        rows.append(
            {
                "block": name,
                "params": sum(p.numel() for p in block.parameters()),
                "gflops": count_flops(block, x) / 1e9,
                "forward_ms": forward.median * 1e3,
                "fwd_bwd_ms": both.median * 1e3,
                "peak_mib": peak_memory(fwd_bwd, device=device).mib,
                "checkerboard": checkerboard_score(block.cpu(), (2, shape[1], *[min(s, 32) for s in shape[2:]])),
            }
        )
        block.to(device)
    return rows


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

    ensure_fits(estimate_training_bytes(model, tuple(input_shape)), f"a training step at input {tuple(input_shape)}")
    fps = measure_fps(model, tuple(input_shape), device=device, iters=runs, amp=amp, channels_last=channels_last)
    x = torch.randn(*input_shape, device=device)
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


def environment_line(device: str) -> str:
    env = environment(device)
    return f"{env['device']}, torch {env['torch']}, {env['threads']} threads"
