"""Transposed convolution, 2D and 3D, with per-axis (anisotropic) scale."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import nn

from upzoo.errors import ConfigError, ShapeError
from upzoo.layers import conv_nd, conv_transpose_nd, to_ntuple
from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import Upsampler

__all__ = ["TransposedConvUpsampler", "CheckerboardWarning", "transposed_output_size", "overlap_counts"]


class CheckerboardWarning(UserWarning):
    """A transposed conv whose kernel size is not a multiple of its stride (uneven overlap)."""


def transposed_output_size(
    size: int, *, kernel_size: int, stride: int, padding: int = 0, output_padding: int = 0, dilation: int = 1
) -> int:
    """PyTorch's full ``ConvTranspose`` output size for one axis:
    ``(size - 1) * stride - 2 * padding + dilation * (kernel_size - 1) + output_padding + 1``.

    >>> transposed_output_size(33, kernel_size=4, stride=2, padding=1)
    66
    """
    return (size - 1) * stride - 2 * padding + dilation * (kernel_size - 1) + output_padding + 1


def overlap_counts(kernel_size: int, stride: int, dilation: int = 1) -> list[int]:
    """How many kernel taps land on each output phase ``0..stride-1`` of a transposed conv (one axis).

    Equal counts mean even overlap; unequal counts are the checkerboard pattern of Odena et al.

    >>> overlap_counts(3, 2), overlap_counts(4, 2), overlap_counts(2, 2, dilation=2)
    ([2, 1], [2, 2], [2, 0])
    """
    counts = [0] * stride
    for tap in range(kernel_size):
        counts[(tap * dilation) % stride] += 1
    return counts


@register_upsampler("transposed")
class TransposedConvUpsampler(Upsampler):
    """Transposed convolution; by default kernel = stride = scale, so output = input x scale exactly.

    ``(B, C_in, *S) -> (B, C_out, *S_out)`` with PyTorch's full output-size formula per axis (see
    :func:`transposed_output_size`); with the defaults ``S_out = S * scale`` and the kernels tile the
    output without overlapping. The classic DCGAN stage is ``kernel_size=4, padding=1`` at scale 2.

    Args:
        kernel_size: int or per-axis tuple; ``None`` means ``scale``. Kernels that overlap unevenly
            on some axis (kernel not a multiple of the stride, see :func:`overlap_counts`) warn once
            (:class:`CheckerboardWarning`).
        padding: int or per-axis tuple.
        output_padding: int or per-axis tuple.
        dilation: int or per-axis tuple.
        bias: add a learned bias.

    Raises:
        ConfigError: negative padding, ``output_padding`` not below ``max(stride, dilation)``.

    >>> up = TransposedConvUpsampler(spatial_dims=3, in_channels=8, out_channels=4, scale=(1, 2, 2))
    >>> up(torch.zeros(1, 8, 5, 16, 16)).shape
    torch.Size([1, 4, 5, 32, 32])
    """

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        kernel_size: int | Sequence[int] | None = None,
        padding: int | Sequence[int] = 0,
        output_padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        bias: bool = True,
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
        n = self.spatial_dims
        self.kernel_size = self.scale if kernel_size is None else to_ntuple(kernel_size, n, "kernel_size")
        self.padding = to_ntuple(padding, n, "padding", minimum=0)
        self.output_padding = to_ntuple(output_padding, n, "output_padding", minimum=0)
        self.dilation = to_ntuple(dilation, n, "dilation")
        for op, s, d in zip(self.output_padding, self.scale, self.dilation):
            if op >= max(s, d):
                raise ConfigError(
                    f"output_padding must be smaller than max(stride, dilation) on every axis, got "
                    f"output_padding={self.output_padding} with stride={self.scale}, dilation={self.dilation}"
                )
        uneven = [
            a
            for a, (k, s, d) in enumerate(zip(self.kernel_size, self.scale, self.dilation))
            if len(set(overlap_counts(k, s, d))) > 1
        ]
        if uneven:
            warnings.warn(
                f"kernel_size={self.kernel_size} at stride {self.scale} overlaps unevenly on axes {uneven} "
                f"(checkerboard risk); use kernel_size = scale or a multiple of it",
                CheckerboardWarning,
                stacklevel=2,
            )
        self.conv = self._make_conv(bias)

    def _make_conv(self, bias: bool, groups: int = 1, out_channels: int | None = None) -> nn.Module:
        """The transposed convolution of this block's geometry (``groups``, ``out_channels``: for
        the depthwise-separable form)."""
        return conv_transpose_nd(self.spatial_dims)(
            self.in_channels,
            self.out_channels if out_channels is None else out_channels,
            kernel_size=self.kernel_size,
            stride=self.scale,
            padding=self.padding,
            output_padding=self.output_padding,
            dilation=self.dilation,
            bias=bias,
            groups=groups,
        )

    def output_spatial(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
        """The output size for input size ``spatial``, by PyTorch's transposed-convolution arithmetic.

        Raises:
            ShapeError: a size the padding would shrink below 1.
        """
        out = tuple(
            transposed_output_size(s, kernel_size=k, stride=st, padding=p, output_padding=op, dilation=d)
            for s, k, st, p, op, d in zip(
                spatial, self.kernel_size, self.scale, self.padding, self.output_padding, self.dilation
            )
        )
        if any(o < 1 for o in out):
            raise ShapeError(
                f"TransposedConvUpsampler would produce spatial size {out} from {tuple(spatial)}; "
                f"reduce padding {self.padding} or grow the input"
            )
        return out

    def upsample(self, x: torch.Tensor) -> torch.Tensor:
        if any(self.padding):
            self.output_spatial(tuple(x.shape[2:]))  # raises ShapeError for a non-positive output
        return self.conv(x)


@register_upsampler("separable_transposed")
class SeparableTransposedUpsampler(TransposedConvUpsampler):
    """Depthwise-separable transposed convolution, the mobile (ARM) advice: a depthwise transposed
    convolution (one kernel per input channel, the same geometry and options as ``transposed``), then
    a 1x1 convolution to ``out_channels``. ``C_in * prod(k) + C_in * C_out`` weights instead of
    ``C_in * C_out * prod(k)``: it equals a transposed convolution whose kernel for each pair of
    channels is the depthwise kernel scaled by the pointwise weight (a rank-one kernel).

    >>> up = SeparableTransposedUpsampler(spatial_dims=2, in_channels=8, out_channels=4, scale=2)
    >>> up(torch.zeros(1, 8, 5, 5)).shape
    torch.Size([1, 4, 10, 10])

    Raises:
        ConfigError: as ``transposed``.
    """

    def _make_conv(self, bias: bool, groups: int = 1, out_channels: int | None = None) -> nn.Module:
        depthwise = super()._make_conv(bias, groups=self.in_channels, out_channels=self.in_channels)
        pointwise = conv_nd(self.spatial_dims)(self.in_channels, self.out_channels, 1, bias=bias)
        return nn.Sequential(depthwise, pointwise)
