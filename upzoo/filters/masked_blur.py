"""Masked Gaussian blur: blur only the pixels at or above a threshold (or inside a mask).

The problem it solves: a generator that ends with a per-pixel Python loop blurring "bright" pixels
makes ``backward()`` take minutes. Here the blur is one autograd node that saves nothing but the
input (and the user's mask). Two implementations sit behind it, with the same results:

- a fused C kernel (``_masked_blur_cpu.c``, built at install when a C compiler is there) for the
  common case: contiguous float32/float64 CPU tensors with a hard threshold — one pass over memory
  for the forward, two for the backward;
- separable shift-and-add arithmetic over whole tensors in PyTorch for everything else (GPU, other
  dtypes and memory formats, ``mask``, ``soft``).

:data:`FUSED_CPU_KERNEL` says whether the kernel was built.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from upzoo.errors import ConfigError, ShapeError
from upzoo.filters.blur_eager import MaskedBlurFunction
from upzoo.filters.blur_fused import FUSED_CPU_KERNEL, fused_applies, fused_masked_blur, pytorch_formulation
from upzoo.filters.blur_plan import Border, gaussian_taps, make_plan, taps_and_steps
from upzoo.filters.select_blur import select_blur
from upzoo.layers import refuse_jit_trace, to_ntuple
from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import PostFilter

__all__ = [
    "masked_gaussian_blur",
    "MaskedGaussianBlur",
    "gaussian_taps",
    "Border",
    "FUSED_CPU_KERNEL",
    "pytorch_formulation",
]


def masked_gaussian_blur(
    x: torch.Tensor,
    *,
    threshold: float = 0.0,
    mask: torch.Tensor | None = None,
    kernel_size: int | Sequence[int] = 3,
    sigma: float | Sequence[float] | None = None,
    border: Border = "valid",
    stride: int | Sequence[int] = 1,
    soft: float | None = None,
) -> torch.Tensor:
    """Replace each pixel whose value is ``>= threshold`` (or where ``mask``) by the Gaussian blur of
    its neighbourhood; the blur always reads the unmodified input. Per channel, 2D or 3D.

    ``(B, C, *S) -> (B, C, *S)``, same dtype and memory format.

    Args:
        x: ``(B, C, H, W)`` or ``(B, C, D, H, W)`` floating-point tensor.
        threshold: pixels with ``x >= threshold`` are blurred (ignored when ``mask`` is given).
        mask: bool tensor broadcastable to ``x`` choosing the pixels to blur, or a float tensor of
            blend weights in [0, 1] (differentiable).
        kernel_size: odd size, int or per axis. ``sigma=None`` with 3 is ``[1,2,1] x [1,2,1] / 16``.
        sigma: Gaussian sigma (int/float or per axis); ``None`` as in :func:`gaussian_taps`.
        border: ``valid`` leaves the outer ring of ``kernel_size // 2`` pixels untouched (exactly the
            classic loop); ``zeros``, ``reflect`` and ``replicate`` pad the input to blur every pixel.
        stride: blur only the pixels on the grid ``r = kernel_size // 2 (mod stride)`` per axis, the
            grid of the classic loop stepping by ``stride``; the output keeps the input's shape.
        soft: temperature ``T``: blend with weight ``sigmoid((x - threshold) / T)`` so the threshold
            decision itself is differentiable.

    On the CPU, contiguous float32/float64 input with a hard threshold runs the fused C kernel when
    it was built (:data:`FUSED_CPU_KERNEL`); everything else runs the PyTorch formulation. Both give
    the same values and gradients. Double backward (``create_graph=True``) works for a hard threshold
    or a bool mask.

    Raises:
        ShapeError: not a 4D/5D tensor, mask not broadcastable, too small for ``reflect``.
        ConfigError: bad kernel size, sigma, border, stride, soft, or non-float input.

    >>> x = torch.tensor([[[[0., 0, 0], [0, 4, 0], [0, 0, 0]]]])
    >>> masked_gaussian_blur(x, threshold=1.0)[0, 0, 1, 1].item()
    1.0
    """
    _check_tensors(x, mask, soft)
    taps, steps = taps_and_steps(x.ndim - 2, kernel_size, sigma, border, stride, soft, threshold)
    return _blur(x, mask, taps, border, steps, float(threshold), None if soft is None else float(soft))


def _check_tensors(x: torch.Tensor, mask: torch.Tensor | None, soft: float | None) -> None:
    refuse_jit_trace("masked_gaussian_blur")
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"masked_gaussian_blur expects a torch.Tensor, got {type(x).__name__}")
    if x.ndim not in (4, 5):
        raise ShapeError(
            f"masked_gaussian_blur expects (B, C, H, W) or (B, C, D, H, W), got {x.ndim} dims {tuple(x.shape)}; "
            f"add batch/channel axes with x[None] or x[None, None]"
        )
    if not x.is_floating_point():
        raise ConfigError(f"masked_gaussian_blur expects a floating-point tensor, got {x.dtype}; use x.float()")
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise ConfigError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        try:
            broadcast = torch.broadcast_shapes(mask.shape, x.shape)
        except RuntimeError:
            broadcast = None
        if broadcast != x.shape:
            raise ShapeError(f"mask of shape {tuple(mask.shape)} does not broadcast to the input {tuple(x.shape)}")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise ConfigError(f"mask must be bool (hard) or floating (blend weights), got {mask.dtype}")
        if mask.is_floating_point() and mask.numel() and not torch.compiler.is_compiling():
            low, high = torch.aminmax(mask.detach())
            if not (bool(torch.isfinite(low)) and bool(torch.isfinite(high)) and low >= 0 and high <= 1):
                raise ConfigError(
                    f"a float mask holds blend weights in [0, 1], got values in [{float(low):.4g}, {float(high):.4g}]"
                    f"{' (NaN)' if bool(torch.isnan(mask).any()) else ''}; clamp or rescale it"
                )
        if soft is not None:
            raise ConfigError(
                "soft applies to the threshold; with a mask, pass float blend weights as the mask instead"
            )


def _blur(x: torch.Tensor, mask: torch.Tensor | None, taps: tuple, border: str, steps: tuple, threshold: float, soft):
    """The blur with checked options: the fused op where it applies (eager, compile and
    ``torch.export`` alike), the select formulation when traced otherwise or exported to ONNX, and
    the lean shift-and-add autograd function in eager."""
    if fused_applies(x, mask, taps, soft) and not torch.onnx.is_in_onnx_export():
        flat = [t for k in taps for t in k]
        return fused_masked_blur(x, flat, [len(k) for k in taps], border, list(steps), threshold)
    if torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export():
        return select_blur(x, mask, taps, border, steps, threshold, soft)
    plan = make_plan(x.shape[2:], taps, border, steps)
    if any(count == 0 for _, count, _ in plan.lattice):
        return x.clone()  # nothing to blur (input smaller than the kernel with border='valid')
    return MaskedBlurFunction.apply(x, mask, plan, threshold, soft)


class MaskedGaussianBlur(PostFilter):
    """Module form of :func:`masked_gaussian_blur` (same arguments, fixed at construction); a
    post-filter of the upsampler contract (scale 1, channels kept).

    ``(B, C, *S) -> (B, C, *S)``. ``spatial_dims`` and ``channels`` (optional) are checked on input.

    >>> blur = MaskedGaussianBlur(threshold=0.5)
    >>> blur(torch.rand(2, 3, 16, 16)).shape
    torch.Size([2, 3, 16, 16])
    """

    def __init__(
        self,
        *,
        threshold: float = 0.0,
        kernel_size: int | Sequence[int] = 3,
        sigma: float | Sequence[float] | None = None,
        border: Border = "valid",
        stride: int | Sequence[int] = 1,
        soft: float | None = None,
        spatial_dims: int = 2,
        channels: int | None = None,
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, channels=channels)
        self.options = dict(
            threshold=threshold, kernel_size=kernel_size, sigma=sigma, border=border, stride=stride, soft=soft
        )
        # checked now, not at forward
        self._taps, self._steps = taps_and_steps(spatial_dims, kernel_size, sigma, border, stride, soft, threshold)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        self.output_shape(x.shape)
        return self.upsample(x, mask)

    def upsample(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        _check_tensors(x, mask, self.options["soft"])
        soft = self.options["soft"]
        threshold, soft = float(self.options["threshold"]), None if soft is None else float(soft)
        return _blur(x, mask, self._taps, self.options["border"], self._steps, threshold, soft)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


@register_upsampler("masked_blur", kind="post_filter", spatial_dims=(2, 3))
def masked_blur_filter(
    *,
    spatial_dims: int,
    in_channels: int,
    out_channels: int,
    scale: int | Sequence[int] = 1,
    threshold: float = 0.0,
    kernel_size: int | Sequence[int] = 3,
    sigma: float | Sequence[float] | None = None,
    border: Border = "valid",
    stride: int | Sequence[int] = 1,
    soft: float | None = None,
) -> MaskedGaussianBlur:
    """Masked Gaussian blur post-filter: blur pixels >= threshold, keep the rest (scale 1)."""
    if spatial_dims not in (2, 3):
        raise ConfigError(f"masked_blur supports spatial_dims 2 or 3, got {spatial_dims!r}")
    if to_ntuple(scale, spatial_dims, "scale") != (1,) * spatial_dims:
        raise ConfigError(f"masked_blur is a post-filter and keeps the size: scale must be 1, got {scale!r}")
    if in_channels != out_channels:
        raise ConfigError(
            f"masked_blur keeps the channels: out_channels must equal in_channels ({in_channels}), got {out_channels}"
        )
    return MaskedGaussianBlur(
        threshold=threshold,
        kernel_size=kernel_size,
        sigma=sigma,
        border=border,
        stride=stride,
        soft=soft,
        spatial_dims=spatial_dims,
        channels=in_channels,
    )
