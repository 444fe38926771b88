"""Resize-convolution: interpolate by the scale, then a "same" convolution (Odena et al. 2016)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from upzoo.checks import check_odd
from upzoo.layers import conv_nd, to_ntuple
from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import Upsampler
from upzoo.upsamplers.interpolate import InterpMode, check_interp_mode, resize

__all__ = ["InterpConvUpsampler"]


@register_upsampler("interp_conv")
class InterpConvUpsampler(Upsampler):
    """Resize (nearest, bilinear/bicubic, trilinear) then a same-padded conv: checkerboard-free.

    ``(B, C_in, *S) -> (B, C_out, *S * scale)``.

    Args:
        mode: ``nearest`` (default), ``nearest-exact``, ``bilinear``/``bicubic`` (2D), ``trilinear`` (3D),
            ``fourier`` (the spectrum zero-padded: :func:`~upzoo.upsamplers.fourier.fourier_resample`).
        align_corners: as in :func:`torch.nn.functional.interpolate`, smooth modes only.
        kernel_size: odd conv kernel, int or per axis.
        bias: add a learned bias.

    >>> up = InterpConvUpsampler(spatial_dims=2, in_channels=4, out_channels=2, scale=(2, 3), mode="bilinear")
    >>> up(torch.zeros(1, 4, 5, 5)).shape
    torch.Size([1, 2, 10, 15])

    Raises:
        ConfigError: an even ``kernel_size``.
    """

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        mode: InterpMode = "nearest",
        align_corners: bool | None = None,
        kernel_size: int | Sequence[int] = 3,
        bias: bool = True,
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
        check_interp_mode(mode, self.spatial_dims, align_corners)
        self.mode = mode
        self.align_corners = align_corners
        self.kernel_size = to_ntuple(kernel_size, self.spatial_dims, "kernel_size")
        check_odd(self.kernel_size, "interp_conv kernel_size")
        self.conv = conv_nd(self.spatial_dims)(
            self.in_channels,
            self.out_channels,
            kernel_size=self.kernel_size,
            padding=tuple(k // 2 for k in self.kernel_size),
            bias=bias,
        )

    def upsample(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(resize(x, self.scale, self.mode, self.align_corners))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode!r}"
