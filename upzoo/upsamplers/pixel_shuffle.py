"""Sub-pixel convolution: conv to ``C * prod(scale)`` channels, then a (voxel) shuffle, ICNR init."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_odd
from upzoo.errors import ConfigError
from upzoo.layers import avg_pool_nd, conv_nd, to_ntuple
from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import Upsampler

__all__ = ["PixelShuffleUpsampler", "pixel_shuffle_nd", "icnr_"]


def pixel_shuffle_nd(x: torch.Tensor, scale: Sequence[int]) -> torch.Tensor:
    """Rearrange ``(B, C * prod(scale), *S) -> (B, C, *S * scale)`` for any number of spatial axes.

    Channel ``c * prod(scale) + sub`` lands at sub-position ``sub`` (row-major over the axes) of
    channel ``c``: for 2D and an isotropic scale this is exactly :func:`torch.nn.functional.pixel_shuffle`.

    >>> pixel_shuffle_nd(torch.zeros(1, 16, 3, 5, 5), (1, 2, 4)).shape
    torch.Size([1, 2, 3, 10, 20])
    """
    n = len(scale)
    b, c, *spatial = x.shape
    product = 1
    for r in scale:
        product *= r
    channels = c // product
    x = x.reshape(b, channels, *scale, *spatial)
    # (B, C, r1..rn, S1..Sn) -> (B, C, S1, r1, ..., Sn, rn)
    order = [0, 1] + [i for a in range(n) for i in (2 + n + a, 2 + a)]
    x = x.permute(order)
    return x.reshape(b, channels, *(s * r for s, r in zip(spatial, scale)))


def icnr_(weight: torch.Tensor, scale_product: int, init=nn.init.kaiming_normal_) -> torch.Tensor:
    """ICNR (Aitken et al. 2017), in place: initialise one kernel per output channel and repeat it
    for each of its ``scale_product`` sub-positions, so the freshly built block equals nearest
    upsampling of a conv and has no checkerboard. ``weight`` is ``(C_out * scale_product, C_in, *k)``.
    """
    out_channels = weight.shape[0] // scale_product
    sub = torch.empty(out_channels, *weight.shape[1:], dtype=weight.dtype, device=weight.device)
    init(sub)
    with torch.no_grad():
        weight.copy_(sub.repeat_interleave(scale_product, dim=0))
    return weight


@register_upsampler("pixel_shuffle")
class PixelShuffleUpsampler(Upsampler):
    """Sub-pixel conv: conv to C_out*prod(scale) channels, (voxel) shuffle; ICNR init, anisotropic.

    ``(B, C_in, *S) -> (B, C_out, *S * scale)``. Works for any per-axis scale in 2D and 3D, e.g.
    ``(1, 2, 2)`` for a volume upsampled in-plane only.

    Args:
        kernel_size: odd conv kernel (int or per axis), "same" padding; ``None``: no convolution,
            the shuffle alone (the ``reshape`` mode of Schwarz et al.'s generator testbed), which
            needs ``in_channels == out_channels * prod(scale)``.
        icnr: ICNR initialisation so the initial output has no checkerboard; ``None`` (default):
            whenever there is a convolution.
        blur: the anti-checkerboard blur of Sugawara et al.: replicate-pad ``scale - 1`` in front and
            average over a ``scale``-sized window, stride 1 (output shape unchanged).
        bias: add a learned bias.

    >>> up = PixelShuffleUpsampler(spatial_dims=2, in_channels=16, out_channels=8, scale=2)
    >>> up(torch.zeros(1, 16, 7, 9)).shape
    torch.Size([1, 8, 14, 18])

    Raises:
        ConfigError: an even ``kernel_size``, or ``icnr``/``bias`` without a convolution.
    """

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        kernel_size: int | Sequence[int] | None = 3,
        icnr: bool | None = None,
        blur: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
        self.blur = bool(blur)
        if kernel_size is None:
            self._shuffle_only(icnr, bias)
            return
        self.kernel_size = to_ntuple(kernel_size, self.spatial_dims, "kernel_size")
        check_odd(self.kernel_size, "pixel_shuffle kernel_size")
        self.icnr = True if icnr is None else bool(icnr)
        self.conv = conv_nd(self.spatial_dims)(
            self.in_channels,
            self.out_channels * self.scale_product,
            kernel_size=self.kernel_size,
            padding=tuple(k // 2 for k in self.kernel_size),
            bias=bias,
        )
        self.reset_parameters()

    def _shuffle_only(self, icnr: bool | None, bias: bool) -> None:
        """``kernel_size=None``: no convolution, so neither ICNR nor a bias, and the input must
        already hold ``out_channels * prod(scale)`` channels."""
        if icnr or not bias:
            option = "icnr=True" if icnr else "bias=False"
            raise ConfigError(f"pixel_shuffle {option} applies to its convolution, and kernel_size=None has none; "
                              f"leave it unset or give a kernel_size")  # fmt: skip
        if self.in_channels != self.out_channels * self.scale_product:
            raise ConfigError(
                f"pixel_shuffle without a convolution (kernel_size=None) rearranges channels into positions: "
                f"in_channels must be out_channels * {self.scale_product} = {self.out_channels * self.scale_product}, "
                f"got {self.in_channels}"
            )
        self.kernel_size, self.icnr, self.conv = None, False, None

    def reset_parameters(self) -> None:
        if self.conv is None:
            return
        if self.icnr:
            icnr_(self.conv.weight, self.scale_product)
            if self.conv.bias is not None:
                nn.init.zeros_(self.conv.bias)
        else:
            self.conv.reset_parameters()

    def upsample(self, x: torch.Tensor) -> torch.Tensor:
        y = x if self.conv is None else self.conv(x)
        if self.spatial_dims == 2 and self.scale[0] == self.scale[1]:
            y = F.pixel_shuffle(y, self.scale[0])
        else:
            y = pixel_shuffle_nd(y, self.scale)
        if self.blur:
            pad = [p for r in reversed(self.scale) for p in (r - 1, 0)]
            pool = avg_pool_nd(self.spatial_dims)
            y = pool(F.pad(y, pad, mode="replicate"), kernel_size=self.scale, stride=1)
        return y
