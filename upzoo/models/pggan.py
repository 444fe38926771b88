"""PGGAN's generator (Karras et al., ICLR 2018) at full resolution, every x2 stage a registered
upsampler: the generator of Schwarz et al.'s generator testbed (NeurIPS 2021), written from the
papers' definitions."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError, ShapeError
from upzoo.models.stage_blocks import stage_block
from upzoo.registry import block_options

__all__ = ["PGGANGenerator", "EqualizedConv2d", "pixel_norm"]


def pixel_norm(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Each position's feature vector divided by its root mean square over the channels (PGGAN)."""
    return x * torch.rsqrt(x.square().mean(1, keepdim=True) + eps)


class EqualizedConv2d(nn.Module):
    """A convolution with PGGAN's equalised learning rate: weights drawn from N(0, 1) and scaled at
    every call by ``gain / sqrt(fan_in)`` (He's constant), biases zero; ``same`` padding unless
    ``padding`` is given. ``(B, C_in, H, W) -> (B, C_out, H', W')``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, *, gain: float = math.sqrt(2),
                 padding: int | None = None) -> None:  # fmt: skip
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.scale = gain / math.sqrt(in_channels * kernel_size**2)
        self.padding = kernel_size // 2 if padding is None else padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight * self.scale, self.bias, padding=self.padding)

    def extra_repr(self) -> str:
        out_channels, in_channels, kernel = self.weight.shape[:3]
        return f"{in_channels}, {out_channels}, kernel_size={kernel}, padding={self.padding}"


class _Stage(nn.Module):
    """(upsampler) -> equalised 3x3 conv -> LeakyReLU(0.2) -> pixel norm, twice: PGGAN's stage
    (``PN(act(conv(x)))`` in the authors' ``G_paper``), so every stage's output, the last one's
    before the 1x1 ToRGB too, is pixel-normalised."""

    def __init__(self, up: nn.Module | None, in_channels: int, channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = up
        self.conv1 = EqualizedConv2d(in_channels, channels, 3)
        self.conv2 = EqualizedConv2d(channels, out_channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pixel_norm(F.leaky_relu(self.conv1(x if self.up is None else self.up(x)), 0.2))
        return pixel_norm(F.leaky_relu(self.conv2(x), 0.2))


def _expansion(upsampler: str, options: dict[str, Any]) -> int:
    """How many more channels the block takes than it gives: 4 for ``pixel_shuffle`` without a
    convolution (``kernel_size: null``, the testbed's ``reshape`` mode, which PGGAN feeds from a
    stage whose last convolution writes 4x the channels), else 1."""
    return 4 if upsampler == "pixel_shuffle" and "kernel_size" in options and options["kernel_size"] is None else 1


class PGGANGenerator(nn.Module):
    """``z (B, latent_dim) -> image (B, out_channels, R, R)``, unbounded (no tanh: the testbed
    regresses images in [-1, 1] with an MSE loss).

    The latent is pixel-normalised and mapped to ``4 x 4`` by a 4x4 convolution (PGGAN's dense
    layer), then ``log2(R / 4)`` stages each upsample x2 with the registered ``upsampler`` (between
    the pixel norm and the first convolution, where PGGAN resizes), and a 1x1 convolution writes the
    image. Widths ``min(fmaps_base / r, fmaps_max) / channel_divisor`` at resolution ``r``; the
    testbed's generator is ``latent_dim=64, channel_divisor=8`` at 64x64. All convolutions use
    the equalised learning rate (:class:`EqualizedConv2d`). Blocks are built with as many output
    channels as input channels (the stage's convolution changes the width), except ``pixel_shuffle``
    without a convolution, which takes 4x the channels from the stage before it.

    Differences from the testbed's code (autonomousvision/frequency_bias, genforce's PGGAN): only
    the full-resolution output layer is built (progressive growing is not used by the testbed) and
    there is no label input.

    >>> net = PGGANGenerator(resolution=16, latent_dim=8, channel_divisor=64, upsampler="zero_insertion")
    >>> net(torch.randn(2, 8)).shape
    torch.Size([2, 3, 16, 16])

    Raises:
        ConfigError: a resolution that is not a power of two from 8 to 1024, widths below one
            channel, or a block that does not double the size.
    """

    def __init__(
        self,
        *,
        resolution: int,
        latent_dim: int,
        out_channels: int = 3,
        upsampler: str = "interpolate",
        upsampler_options: dict[str, Any] | None = None,
        channel_divisor: int = 1,
        fmaps_base: int = 16384,
        fmaps_max: int = 512,
    ) -> None:
        super().__init__()
        if (
            not isinstance(resolution, int)
            or isinstance(resolution, bool)
            or resolution not in [2**k for k in range(3, 11)]
        ):
            raise ConfigError(f"PGGANGenerator resolution must be a power of two from 8 to 1024, got {resolution!r}")
        self.resolution, self.latent_dim = resolution, check_positive_int(latent_dim, "latent_dim")
        self.out_channels = check_positive_int(out_channels, "out_channels")
        divisor = check_positive_int(channel_divisor, "channel_divisor")
        base, most = check_positive_int(fmaps_base, "fmaps_base"), check_positive_int(fmaps_max, "fmaps_max")
        sizes = [4 * 2**i for i in range(int(math.log2(resolution)) - 1)]
        widths = [min(base // r, most) // divisor for r in sizes]
        if min(widths) < 1:
            raise ConfigError(
                f"PGGANGenerator widths {widths} (min(fmaps_base / r, fmaps_max) / channel_divisor at r = {sizes}) "
                f"fall below one channel; lower channel_divisor or raise fmaps_base"
            )
        options = block_options(upsampler_options, "PGGANGenerator")
        self.stages = _stages(latent_dim, widths, upsampler, options)
        self.to_image = EqualizedConv2d(widths[-1], self.out_channels, 1, gain=1.0)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Images ``(B, out_channels, resolution, resolution)`` from latents ``(B, latent_dim)``.

        Raises:
            ShapeError: latents that are not ``(B, latent_dim)``.
        """
        if z.ndim != 2 or z.shape[1] != self.latent_dim:
            raise ShapeError(f"PGGANGenerator expects latents (B, {self.latent_dim}), got {tuple(z.shape)}")
        x = pixel_norm(z)[:, :, None, None]
        return self.to_image(self.stages(x))


def _stages(latent_dim: int, widths: list[int], upsampler: str, options: dict[str, Any]) -> nn.Sequential:
    """The 4x4 stage (from the latent) and one x2 stage per further width."""
    expand = _expansion(upsampler, options)
    first = _Stage(None, latent_dim, widths[0], widths[0] * (expand if len(widths) > 1 else 1))
    first.conv1 = EqualizedConv2d(latent_dim, widths[0], 4, padding=3)  # 1x1 -> 4x4: PGGAN's dense layer
    stages: list[nn.Module] = [first]
    for i in range(1, len(widths)):
        channels = widths[i - 1]
        up = stage_block(upsampler, options, where=f"PGGANGenerator stage {i}", in_channels=channels * expand,
                         out_channels=channels, scale=2)  # fmt: skip
        last = i == len(widths) - 1
        stages.append(_Stage(up, channels, widths[i], widths[i] * (1 if last else expand)))
    return nn.Sequential(*stages)
