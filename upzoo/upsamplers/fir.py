"""FIR upsampling: zero insertion, then a separable low-pass filter (StyleGAN2's ``upsample2d``,
Karras et al. 2020, "Analyzing and Improving the Image Quality of StyleGAN"), written from its
definition; an optional same-padded convolution after it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

import numpy as np
import torch
import torch.nn.functional as F

from upzoo.checks import check_odd
from upzoo.errors import ConfigError
from upzoo.layers import conv_nd
from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import Upsampler

__all__ = ["FirUpsampler", "fir_upsample", "fir_padding", "default_taps"]


def fir_padding(taps: int, scale: int) -> tuple[int, int]:
    """Padding ``(before, after)`` of the zero-inserted signal so that ``taps`` taps give exactly
    ``scale`` times the input (StyleGAN2's alignment): ``((n - s + 1) // 2 + s - 1, (n - s) // 2)``.

    >>> fir_padding(4, 2)
    (2, 1)
    """
    return (taps - scale + 1) // 2 + scale - 1, (taps - scale) // 2


def fir_upsample(x: torch.Tensor, taps: torch.Tensor, scale: Sequence[int]) -> torch.Tensor:
    """``(B, C, *S) -> (B, C, *S * scale)``: along every axis whose scale ``s > 1``, ``s - 1`` zeros
    after each sample, the padding of :func:`fir_padding`, and a convolution with ``taps * s``
    (``taps`` normalised to sum 1, so a constant stays constant: gain ``s`` per axis, ``prod(scale)``
    in all), computed as one depthwise transposed convolution (the same sums). Axes of scale 1 are
    left as they are (no blur across slices of an anisotropic volume).

    >>> y = fir_upsample(torch.ones(1, 1, 3, 3), torch.tensor([1.0, 3.0, 3.0, 1.0]) / 8, (2, 2))
    >>> y.shape, bool(torch.allclose(y[..., 1:-1, 1:-1], torch.ones(1, 1, 4, 4)))
    (torch.Size([1, 1, 6, 6]), True)
    """
    channels, kernel = x.shape[1], torch.ones((), dtype=x.dtype, device=x.device)
    for s in scale:  # the separable filter as one kernel: the outer product of the axes' taps
        kernel = kernel.unsqueeze(-1) * (taps.to(x.dtype) * s if s > 1 else kernel.new_ones(1))
    padding = [(len(taps) - s) // 2 if s > 1 else 0 for s in scale]
    # A transposed convolution is zero insertion followed by a full convolution (not a correlation):
    # the padding keeps the window from `fir_padding`, in one pass over the input instead of over
    # the zero-inserted signal (about 3x faster forward+backward than inserting the zeros).
    transposed = getattr(F, f"conv_transpose{x.dim() - 2}d")
    y = transposed(x, kernel.expand(channels, 1, *kernel.shape), stride=tuple(scale), padding=padding, groups=channels)
    for axis, s in enumerate(scale):
        if s > 1 and (len(taps) - s) % 2:  # one sample more than scale x the input: drop the last
            y = y.narrow(2 + axis, 0, x.shape[2 + axis] * s)
    return y


def default_taps(scale: int) -> list[float]:
    """A box of ``scale`` samples convolved with itself twice (``3 * scale - 2`` taps): StyleGAN2's
    ``[1, 3, 3, 1]`` at scale 2, and the same construction at any scale.

    >>> default_taps(2), len(default_taps(8))
    ([1.0, 3.0, 3.0, 1.0], 22)
    """
    box = np.ones(scale)
    return np.convolve(np.convolve(box, box), box).tolist()


def _checked_taps(taps: object, scale: Sequence[int]) -> torch.Tensor:
    """The taps as a float64 tensor normalised to sum 1.

    Raises:
        ConfigError: not a non-empty sequence of finite real numbers, a sum of zero, or fewer taps
            than the largest scale (zero insertion would leave zeros the filter cannot fill).
    """
    values = taps.tolist() if isinstance(taps, torch.Tensor) else taps
    numbers = isinstance(values, (list, tuple)) and len(values) > 0
    if not numbers or not all(isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise ConfigError(f"fir taps must be a non-empty list of finite numbers, e.g. [1, 3, 3, 1], got {taps!r}")
    total = math.fsum(values)
    if abs(total) < 1e-12 * max(abs(v) for v in values) or total == 0:
        raise ConfigError(f"fir taps must not sum to zero (a low-pass filter keeps the mean), got {list(values)}")
    if len(values) < max(scale):
        raise ConfigError(
            f"fir taps: {len(values)} taps cannot fill the {max(scale) - 1} zeros inserted per sample at scale "
            f"{max(scale)}; give at least {max(scale)} taps (e.g. [1, 3, 3, 1] for scale 2)"
        )
    return torch.tensor(values, dtype=torch.float64) / total


@register_upsampler("fir")
class FirUpsampler(Upsampler):
    """Zero insertion and a separable FIR low-pass (StyleGAN2's upsample2d), then a same-padded conv.

    With the convolution it can stand where a transposed convolution or a resize-conv stood.

    ``(B, C_in, *S) -> (B, C_out, *S * scale)``. The filter is StyleGAN2's ``upsample2d``
    (``[1, 3, 3, 1]`` at scale 2, normalised, gain ``scale`` per axis), aligned so the output is
    exactly ``scale`` times the input (:func:`fir_padding`); axes of scale 1 are not filtered. The
    taps are a fixed, non-persistent buffer; the convolution is the only learned part.

    Args:
        taps: the 1D filter taps, applied along every upsampled axis (separable); at least as many
            as the largest scale. Default: :func:`default_taps` of the largest scale (``[1, 3, 3, 1]``
            at 2, StyleGAN2's).
        kernel_size: odd kernel of the convolution after the filter; ``None`` for none (then
            ``out_channels`` must equal ``in_channels``).
        bias: the convolution's bias.

    >>> up = FirUpsampler(spatial_dims=2, in_channels=4, out_channels=2, scale=2)
    >>> up(torch.zeros(1, 4, 5, 7)).shape
    torch.Size([1, 2, 10, 14])

    Raises:
        ConfigError: a filter that is not a list of finite taps, or an even ``kernel_size``.
    """

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        taps: Sequence[float] | None = None,
        kernel_size: int | None = 3,
        bias: bool = True,
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
        taps = default_taps(max(self.scale)) if taps is None else taps
        self.register_buffer("taps", _checked_taps(taps, self.scale).float(), persistent=False)
        if kernel_size is None:
            if self.out_channels != self.in_channels:
                raise ConfigError(
                    f"fir without a convolution (kernel_size=None) keeps the channels: out_channels "
                    f"({self.out_channels}) must equal in_channels ({self.in_channels}); or give a kernel_size"
                )
            self.conv = None
        else:
            check_odd(kernel_size, "fir kernel_size")
            self.conv = conv_nd(self.spatial_dims)(
                self.in_channels, self.out_channels, kernel_size, padding=kernel_size // 2, bias=bool(bias)
            )

    def upsample(self, x: torch.Tensor) -> torch.Tensor:
        y = fir_upsample(x, self.taps, self.scale)
        return self.conv(y) if self.conv is not None else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, taps={len(self.taps)}"
