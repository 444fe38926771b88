"""Single-image super-resolution networks whose upsampling tail is any registered block: ESPCN,
an EDSR-baseline-sized network and an RRDB-lite network (ESRGAN's generator, smaller). Inputs and
outputs are images in [0, 1], ``(B, C, H, W) -> (B, C, H * scale, W * scale)``; any input size.

The tail upsamples in x2 stages (``tail: stages``, BasicSR's ``Upsample``: one block per x2) or
with one block for the whole scale (``tail: whole``, ESPCN's single pixel shuffle; the only way to
reach x3); ``auto`` takes stages where the scale is a power of two. Each network keeps its paper's block by default:
pixel shuffle for ESPCN and EDSR, nearest + conv for RRDB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError
from upzoo.layers import check_input_shape
from upzoo.models.stage_blocks import stage_block
from upzoo.registry import block_options

__all__ = ["ESPCN", "EDSR", "RRDBNet", "SRDiscriminator", "SR_SCALES", "tail_factors", "build_tail"]

SR_SCALES = (2, 3, 4, 8)
Tail = Literal["auto", "stages", "whole"]
DIV2K_MEAN = (0.4488, 0.4371, 0.4040)  # EDSR's mean shift


def tail_factors(scale: int, tail: str, owner: str) -> list[int]:
    """The scale of each tail block: x2 stages (``auto``: for a power of two) or one block.

    Raises:
        ConfigError: a scale not in :data:`SR_SCALES`, or ``stages`` for a scale that is not a power of two.
    """
    if isinstance(scale, bool) or scale not in SR_SCALES:
        raise ConfigError(f"{owner}: scale must be one of {', '.join(map(str, SR_SCALES))}, got {scale!r}")
    if tail not in ("auto", "stages", "whole"):
        raise ConfigError(f"{owner}: tail must be 'auto', 'stages' (x2 blocks) or 'whole' (one block), got {tail!r}")
    power_of_two = not scale & (scale - 1)
    if tail == "whole" or (tail == "auto" and not power_of_two):
        return [scale]
    if not power_of_two:
        raise ConfigError(f"{owner}: scale {scale} is not a power of two, so it has no x2 stages; use tail: whole")
    return [2] * int(math.log2(scale))


def build_tail(
    channels: int, out_channels: int, factors: list[int], upsampler: str, options: Any, owner: str,
    activation: nn.Module | None = None,
) -> nn.Sequential:  # fmt: skip
    """One block per factor (``channels`` -> ``channels``, the last -> ``out_channels``), each
    followed by ``activation`` where given."""
    options = block_options(options, owner)
    layers: list[nn.Module] = []
    for i, factor in enumerate(factors):  # no high-resolution feature exists to guide the tail: guide_channels=0
        c_out = out_channels if i == len(factors) - 1 else channels
        layers.append(stage_block(upsampler, options, where=f"{owner} tail block {i}", in_channels=channels,
                                  out_channels=c_out, scale=factor))  # fmt: skip
        if activation is not None:
            layers.append(activation)
    return nn.Sequential(*layers)


class _SuperResolution(nn.Module):
    """What every SR network shares: the input check and the scale."""

    scale: int
    in_channels: int

    def _check(self, x: torch.Tensor) -> None:
        check_input_shape(x.shape, spatial_dims=2, channels=self.in_channels, owner=type(self).__name__)

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """``(B, C, H, W) -> (B, C, H * scale, W * scale)``."""
        b, c, h, w = check_input_shape(
            input_shape, spatial_dims=2, channels=self.in_channels, owner=type(self).__name__
        )
        return (b, c, h * self.scale, w * self.scale)


class ESPCN(_SuperResolution):
    """ESPCN (Shi et al., CVPR 2016): conv 5x5 -> tanh -> conv 3x3 -> tanh -> the tail block at the
    whole scale (the paper's conv + pixel shuffle by default).

    >>> ESPCN(scale=3)(torch.rand(1, 3, 10, 12)).shape
    torch.Size([1, 3, 30, 36])

    Raises:
        ConfigError: ``channels`` that are not two widths, a scale or tail that does not fit.
    """

    def __init__(
        self, *, scale: int, in_channels: int = 3, channels: Sequence[int] = (64, 32),
        upsampler: str = "pixel_shuffle", upsampler_options: dict[str, Any] | None = None, tail: Tail = "whole",
    ) -> None:  # fmt: skip
        super().__init__()
        self.in_channels, self.scale = check_positive_int(in_channels, "ESPCN in_channels"), scale
        if isinstance(channels, (str, bytes)) or not isinstance(channels, Sequence) or len(channels) != 2:
            raise ConfigError(f"ESPCN channels: expected two widths [first, second], e.g. [64, 32], got {channels!r}")
        first, second = (check_positive_int(c, "ESPCN channels") for c in channels)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, first, 5, padding=2), nn.Tanh(), nn.Conv2d(first, second, 3, padding=1), nn.Tanh()
        )
        factors = tail_factors(scale, tail, "ESPCN")
        self.tail = build_tail(second, in_channels, factors, upsampler, upsampler_options, "ESPCN")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return self.tail(self.features(x))


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int, res_scale: float) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(True), nn.Conv2d(channels, channels, 3, padding=1)
        )
        self.res_scale = res_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.res_scale * self.body(x)


class EDSR(_SuperResolution):
    """EDSR (Lim et al., CVPRW 2017), the baseline's size by default (16 residual blocks of 64
    channels, no BatchNorm): mean shift, head conv, blocks + conv with a long skip, the tail in x2
    stages (pixel shuffle by default), a last conv to the image.

    >>> EDSR(scale=2, num_blocks=2, channels=16)(torch.rand(1, 3, 8, 8)).shape
    torch.Size([1, 3, 16, 16])

    Raises:
        ConfigError: ``res_scale`` outside (0, 1], a scale or tail that does not fit.
    """

    def __init__(
        self, *, scale: int, in_channels: int = 3, channels: int = 64, num_blocks: int = 16,
        res_scale: float = 1.0, upsampler: str = "pixel_shuffle", upsampler_options: dict[str, Any] | None = None,
        tail: Tail = "auto",
    ) -> None:  # fmt: skip
        super().__init__()
        self.in_channels, self.scale = check_positive_int(in_channels, "EDSR in_channels"), scale
        channels = check_positive_int(channels, "EDSR channels")
        blocks = check_positive_int(num_blocks, "EDSR num_blocks")
        if isinstance(res_scale, bool) or not isinstance(res_scale, (int, float)) or not 0 < res_scale <= 1:
            raise ConfigError(f"EDSR res_scale must be a number in (0, 1], got {res_scale!r}")
        mean = DIV2K_MEAN if in_channels == 3 else (0.5,) * in_channels
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.head = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.body = nn.Sequential(
            *(_ResidualBlock(channels, float(res_scale)) for _ in range(blocks)),
            nn.Conv2d(channels, channels, 3, padding=1),
        )
        factors = tail_factors(scale, tail, "EDSR")
        self.tail = build_tail(channels, channels, factors, upsampler, upsampler_options, "EDSR")
        self.last = nn.Conv2d(channels, in_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        features = self.head(x - self.mean)
        return self.last(self.tail(features + self.body(features))) + self.mean


class _DenseBlock(nn.Module):
    """ESRGAN's residual dense block: five convs, each seeing all earlier outputs, scaled by 0.2."""

    def __init__(self, channels: int, growth: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv2d(channels + i * growth, growth if i < 4 else channels, 3, padding=1) for i in range(5)
        )
        self.act = nn.LeakyReLU(0.2, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for conv in self.convs[:-1]:
            features.append(self.act(conv(torch.cat(features, 1))))
        return x + 0.2 * self.convs[-1](torch.cat(features, 1))


class _RRDB(nn.Module):
    def __init__(self, channels: int, growth: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(_DenseBlock(channels, growth) for _ in range(3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.2 * self.blocks(x)


class RRDBNet(_SuperResolution):
    """ESRGAN's generator (Wang et al., ECCVW 2018) at a size that trains on a CPU: residual-in-
    residual dense blocks (default 4 of 32 channels, growth 16; the paper has 23 of 64, growth 32),
    then the tail in x2 stages each followed by a LeakyReLU (nearest + conv by default, as the
    paper), a conv + LeakyReLU at the output resolution and a last conv.

    >>> RRDBNet(scale=4, num_blocks=1, channels=8, growth=4)(torch.rand(1, 3, 6, 6)).shape
    torch.Size([1, 3, 24, 24])
    """

    def __init__(
        self, *, scale: int, in_channels: int = 3, channels: int = 32, num_blocks: int = 4, growth: int = 16,
        upsampler: str = "interp_conv", upsampler_options: dict[str, Any] | None = None, tail: Tail = "auto",
    ) -> None:  # fmt: skip
        super().__init__()
        self.in_channels, self.scale = check_positive_int(in_channels, "RRDBNet in_channels"), scale
        channels = check_positive_int(channels, "RRDBNet channels")
        growth = check_positive_int(growth, "RRDBNet growth")
        blocks = check_positive_int(num_blocks, "RRDBNet num_blocks")
        self.first = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.body = nn.Sequential(*(_RRDB(channels, growth) for _ in range(blocks)))
        self.body_conv = nn.Conv2d(channels, channels, 3, padding=1)
        factors = tail_factors(scale, tail, "RRDBNet")
        act = nn.LeakyReLU(0.2, True)
        self.tail = build_tail(channels, channels, factors, upsampler, upsampler_options, "RRDBNet", act)
        self.last = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.LeakyReLU(0.2, True),
            nn.Conv2d(channels, in_channels, 3, padding=1),
        )

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """What the tail upsamples (``forward = reconstruct(features(x), x)``)."""
        features = self.first(x)
        return features + self.body_conv(self.body(features))

    def reconstruct(self, features: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.tail(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return self.reconstruct(self.features(x), x)


class SRDiscriminator(nn.Module):
    """A VGG-style discriminator for any patch size (SRGAN's, shortened): conv + LeakyReLU pairs,
    the second of each halving the size, spectral normalisation on every conv, global average
    pooling and a linear logit. ``(B, C, H, W) -> (B,)``."""

    def __init__(self, in_channels: int = 3, base_channels: int = 32, stages: int = 4) -> None:
        super().__init__()
        sn = nn.utils.parametrizations.spectral_norm
        layers: list[nn.Module] = []
        c_in = in_channels
        for i in range(stages):
            c_out = base_channels * 2 ** min(i, 3)
            layers += [sn(nn.Conv2d(c_in, c_out, 3, padding=1)), nn.LeakyReLU(0.2, True)]
            layers += [sn(nn.Conv2d(c_out, c_out, 4, stride=2, padding=1)), nn.LeakyReLU(0.2, True)]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.logit = sn(nn.Linear(c_in, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logit(self.features(x).mean(dim=(2, 3))).squeeze(1)
