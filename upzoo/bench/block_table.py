"""The block table of ``upzoo bench blocks``: every registered upsampler at one input — parameters,
GFLOPs, forward and forward+backward time, peak memory, and the checkerboard score of the fresh block."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from upzoo.bench.artifacts import checkerboard_score, smooth_field
from upzoo.bench.memory import ensure_fits, estimate_training_bytes, peak_memory
from upzoo.bench.speed import environment, time_call
from upzoo.errors import ShapeError
from upzoo.registry import UPSAMPLERS, create_upsampler, list_upsamplers
from upzoo.runtime import autocast

__all__ = ["BLOCK_COLUMNS", "count_flops", "check_block_input", "bench_blocks", "environment_line"]

BLOCK_COLUMNS = ["block", "params", "gflops", "forward_ms", "fwd_bwd_ms", "peak_mib", "checkerboard"]


def count_flops(module: nn.Module, x: torch.Tensor) -> float:
    """Floating-point operations of one forward pass, by PyTorch's FlopCounterMode (convolutions and
    matrix products; element-wise ops and grid_sample are not counted). NaN where the counter itself
    does not fit in memory: it runs attention through the unfused path, which materialises every
    query-key pair (LoftUp at 512x1024 asks for 16 TiB on a GPU that runs the fused kernel in 139)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    try:
        with counter, torch.no_grad():
            module(x)
    except torch.OutOfMemoryError:
        return float("nan")
    return int(counter.get_total_flops())


class GuidedByFixedFeature(nn.Module):
    """A guided block fed one fixed smooth guide per input shape (the skip a U-Net would pass), or a
    style-conditioned block one fixed style per batch (a seeded normal vector, as a mapping network's
    w), so the block tables measure it like every other block: ``forward(x)``. ``wrap`` leaves the
    other blocks as they are."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block, self.scale = block, block.scale
        self._guides: dict[tuple[int, ...], torch.Tensor] = {}

    @classmethod
    def wrap(cls, block: nn.Module) -> nn.Module:
        conditioned = getattr(block, "needs_guide", False) or getattr(block, "needs_style", False)
        return cls(block) if conditioned else block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = tuple(x.shape)
        if key not in self._guides and getattr(self.block, "needs_style", False):
            generator = torch.Generator().manual_seed(1)
            self._guides[key] = torch.randn(x.shape[0], self.block.style_dim, generator=generator).to(x)
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


def default_block_names() -> list[str]:
    """The blocks ``upzoo bench blocks`` measures by default: every registered upsampler but the
    image-guided feature upsamplers (JBU, JAFAR, LoftUp, AnyUp), whose cost is measured at their own
    ratios in their own table (``tools/bench_feature_upsamplers.py``)."""
    from upzoo.upsamplers.image_guided import ImageGuidedUpsampler

    names = list_upsamplers(kind="upsampler")
    return [n for n in names if not _is_subclass(UPSAMPLERS.info(n).factory, ImageGuidedUpsampler)]


def _is_subclass(factory: Any, base: type) -> bool:
    return isinstance(factory, type) and issubclass(factory, base)


def bench_blocks(
    shape: Sequence[int] = (8, 64, 64, 64),
    *,
    scale: int | Sequence[int] = 2,
    device: str = "cpu",
    runs: int = 5,
    names: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    amp: str = "none",
) -> list[dict[str, Any]]:
    """One row per block of ``names`` (default: :func:`default_block_names`) that supports the input's
    dims, at the same input and scale, timed under ``amp`` autocast (``none``, ``bf16``, ``fp16`` on
    CUDA; the checkerboard score is always float32).

    Raises:
        ShapeError: a shape that is not ``(B, C, H, W)`` or ``(B, C, D, H, W)``, or a block that would
            not fit in the free memory at this shape (estimated on the meta device first).
    """
    check_block_input(shape)
    autocast(amp, torch.device(device), "--amp")  # an amp mode this device lacks fails before any block is built
    dims = len(shape) - 2
    rows = []
    for name in names or default_block_names():
        if dims not in UPSAMPLERS.info(name).spatial_dims:
            continue
        if progress:
            progress(name)
        rows.append(_block_row(name, tuple(shape), scale, device, runs, amp))
    return rows


def _build_block(name: str, shape: tuple[int, ...], scale: int | Sequence[int], device: str) -> nn.Module:
    """The block at ``shape``, checked on the meta device to fit in memory first (guided blocks get
    a fixed guide)."""
    guide = {"guide_channels": shape[1]} if UPSAMPLERS.info(name).needs_guide else {}
    guide |= {"style_dim": 512} if UPSAMPLERS.info(name).needs_style else {}
    options = dict(spatial_dims=len(shape) - 2, in_channels=shape[1], out_channels=shape[1], scale=scale, **guide)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            meta = GuidedByFixedFeature.wrap(create_upsampler(name, **options))
        ensure_fits(estimate_training_bytes(meta, shape), f"block {name} at input {shape}")
        return GuidedByFixedFeature.wrap(create_upsampler(name, **options).to(device))


def _block_row(name: str, shape: tuple[int, ...], scale: int | Sequence[int], device: str, runs: int, amp: str) -> dict:
    block = _build_block(name, shape, scale, device)
    x = torch.randn(*shape, device=device)
    x_grad = x.clone().requires_grad_(True)

    def fwd_bwd():
        with autocast(amp, torch.device(device)):
            y = block(x_grad)
        y.backward(torch.ones_like(y))

    def forward_only():
        with torch.no_grad(), autocast(amp, torch.device(device)):
            block(x)

    forward = time_call(forward_only, warmup=2, runs=runs, device=device)
    both = time_call(fwd_bwd, warmup=2, runs=runs, device=device)
    row = {
        "block": name,
        "params": sum(p.numel() for p in block.parameters()),
        "gflops": count_flops(block, x) / 1e9,
        "forward_ms": forward.median * 1e3,
        "fwd_bwd_ms": both.median * 1e3,
        "peak_mib": peak_memory(fwd_bwd, device=device).mib,
        "checkerboard": checkerboard_score(block.cpu(), (2, shape[1], *[min(s, 32) for s in shape[2:]])),
    }
    block.to(device)
    return row


def environment_line(device: str) -> str:
    env = environment(device)
    return (
        f"{env['device']}, {env['cores']} cores, {env['threads']} threads, torch {env['torch']}, "
        f"CPU kernels {env['cpu_capability']}" + (f", CUDA {env['cuda']}" if env.get("cuda") else "")
    )
