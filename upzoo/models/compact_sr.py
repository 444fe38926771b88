"""The compact super-resolution networks whose trained weights install with pip (as ncnn files,
:mod:`upzoo.models.sr_weights` reads them): Real-ESRGAN's ``SRVGGNetCompact``, waifu2x's
``upconv_7`` and SPAN. Each keeps its authors' tail by default and takes any registered block
instead (``upsampler``, ``upsampler_options``), as upzoo's other SR networks. Images in [0, 1],
``(B, C, H, W) -> (B, C, H * scale, W * scale)``; modules are registered in the order their
forward pass runs them (the order of the weights in the authors' files).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError
from upzoo.models.stage_blocks import stage_block
from upzoo.models.super_resolution import _SuperResolution, tail_factors
from upzoo.registry import block_options

__all__ = ["SRVGGNetCompact", "UpConv7", "SPAN", "UPCONV7_TRANSPOSED", "check_upconv7_tail", "compact_tail"]

UPCONV7_TRANSPOSED = {"kernel_size": 4, "padding": 3}  # waifu2x's deconvolution: 4x4, stride 2, cropped by 3


def compact_tail(
    owner: str, upsampler: str, options: Any, channels: int, out_channels: int, scale: int, exact: bool = True
) -> nn.Module:
    """The one block at the whole scale that ends these networks (``owner`` names it in messages)."""
    return stage_block(upsampler, block_options(options, owner), where=f"{owner} tail", in_channels=channels,
                       out_channels=out_channels, scale=scale, exact=exact)  # fmt: skip


def check_upconv7_tail(block: nn.Module) -> None:
    """The tail sees the input + 2 pixels; its output must cover twice the input with an even margin."""
    margins = set()
    for n in (7, 10):
        out = block.output_shape((1, block.in_channels, n, n))[2]
        margins.add(out - 2 * (n - 2))
    margin = margins.pop()
    if margins or margin < 0 or margin % 2:
        raise ConfigError(
            "UpConv7 tail: the block's output must be twice its input plus a fixed, even margin (cropped); "
            f"{type(block).__name__} gives {sorted({margin, *margins})}; use a block whose output is input x 2 "
            "or the default transposed options (kernel_size=4, padding=3)"
        )


class SRVGGNetCompact(_SuperResolution):
    """Real-ESRGAN's compact network (``realesr-animevideov3``; Wang et al., ICCVW 2021): a conv +
    PReLU, ``num_conv`` more of them at the input resolution, then the tail (a conv to ``C * r^2``
    channels and a pixel shuffle by default) added to the nearest-upsampled input.

    >>> SRVGGNetCompact(scale=4, channels=8, num_conv=2)(torch.rand(1, 3, 6, 6)).shape
    torch.Size([1, 3, 24, 24])

    Raises:
        ConfigError: a scale not in 2, 3, 4, 8, or sizes that are not positive integers.
    """

    def __init__(
        self, *, scale: int, in_channels: int = 3, channels: int = 64, num_conv: int = 16,
        upsampler: str = "pixel_shuffle", upsampler_options: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.in_channels, self.scale = check_positive_int(in_channels, "SRVGGNetCompact in_channels"), scale
        tail_factors(scale, "whole", "SRVGGNetCompact")  # the scale check
        channels = check_positive_int(channels, "SRVGGNetCompact channels")
        layers: list[nn.Module] = [nn.Conv2d(in_channels, channels, 3, padding=1), nn.PReLU(channels)]
        for _ in range(check_positive_int(num_conv, "SRVGGNetCompact num_conv")):
            layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.PReLU(channels)]
        self.body = nn.Sequential(*layers)
        self.tail = compact_tail("SRVGGNetCompact", upsampler, upsampler_options, channels, in_channels, scale)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """What the tail upsamples (``forward = reconstruct(features(x), x)``)."""
        return self.body(x)

    def reconstruct(self, features: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.tail(features) + F.interpolate(x, scale_factor=self.scale, mode="nearest")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return self.reconstruct(self.features(x), x)


class UpConv7(_SuperResolution):
    """waifu2x's ``upconv_7`` (x2): the image padded by 7 pixels (edge replicated), six unpadded
    3x3 convs with LeakyReLU(0.1) (16, 32, 64, 128, 128, 256 channels), then the tail — a 4x4
    transposed conv of stride 2 cropped by 3 by default — whose output is centre-cropped to twice
    the input (a block of another size at x2 gives 4 more pixels, cropped 2 per side).

    >>> UpConv7(channels=(4, 4, 4, 4, 4, 8))(torch.rand(1, 3, 5, 5)).shape
    torch.Size([1, 3, 10, 10])

    Raises:
        ConfigError: a scale other than 2, not six widths, or a tail whose output is not twice its
            input plus an even margin.
    """

    prepadding = 7

    def __init__(
        self, *, scale: int = 2, in_channels: int = 3, channels: Sequence[int] = (16, 32, 64, 128, 128, 256),
        upsampler: str = "transposed", upsampler_options: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        if scale != 2:
            raise ConfigError(f"UpConv7: waifu2x's upconv_7 upsamples by 2, got scale {scale!r}; use scale 2")
        if len(channels) != 6:
            raise ConfigError(f"UpConv7: channels lists the six convs' widths, got {len(channels)}: {channels!r}")
        self.in_channels, self.scale = check_positive_int(in_channels, "UpConv7 in_channels"), 2
        widths = [self.in_channels, *(check_positive_int(c, "UpConv7 channels") for c in channels)]
        layers: list[nn.Module] = []
        for c_in, c_out in zip(widths, widths[1:], strict=False):
            layers += [nn.Conv2d(c_in, c_out, 3), nn.LeakyReLU(0.1, True)]
        self.body = nn.Sequential(*layers)
        if upsampler == "transposed" and upsampler_options is None:
            upsampler_options = dict(UPCONV7_TRANSPOSED)
        self.tail = compact_tail("UpConv7", upsampler, upsampler_options, widths[-1], self.in_channels, 2, exact=False)
        check_upconv7_tail(self.tail)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """What the tail upsamples (``forward = reconstruct(features(x), x)``)."""
        return self.body(F.pad(x, [self.prepadding] * 4, mode="replicate"))

    def reconstruct(self, features: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        out = self.tail(features)
        top, left = (out.shape[-2] - 2 * h) // 2, (out.shape[-1] - 2 * w) // 2
        return out[..., top : top + 2 * h, left : left + 2 * w]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return self.reconstruct(self.features(x), x)


class _SPAB(nn.Module):
    """SPAN's attention block: three 3x3 convs (SiLU between), ``(conv3 + x) * (sigmoid(conv3) - 0.5)``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.c1, self.c2, self.c3 = (nn.Conv2d(channels, channels, 3, padding=1) for _ in range(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        first = F.silu(self.c1(x))
        out = self.c3(F.silu(self.c2(first)))
        return (out + x) * (torch.sigmoid(out) - 0.5), first


class SPAN(_SuperResolution):
    """SPAN (Wan et al., CVPRW 2024, the NTIRE 2024 efficient-SR winner): ``(x - mean) * img_range``,
    a conv, six parameter-free-attention blocks, a conv, a 1x1 conv over four of the features
    concatenated, then the tail (conv + pixel shuffle by default).

    >>> SPAN(scale=2, channels=8)(torch.rand(1, 3, 6, 6)).shape
    torch.Size([1, 3, 12, 12])

    Raises:
        ConfigError: a scale not in 2, 3, 4, 8, or an ``rgb_mean`` of another length than the channels.
    """

    def __init__(
        self, *, scale: int, in_channels: int = 3, channels: int = 48, img_range: float = 255.0,
        rgb_mean: Sequence[float] = (0.4488, 0.4371, 0.4040),
        upsampler: str = "pixel_shuffle", upsampler_options: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.in_channels, self.scale = check_positive_int(in_channels, "SPAN in_channels"), scale
        tail_factors(scale, "whole", "SPAN")
        channels = check_positive_int(channels, "SPAN channels")
        if len(rgb_mean) != self.in_channels:
            raise ConfigError(f"SPAN: rgb_mean has {len(rgb_mean)} values for {self.in_channels} channels")
        self.img_range = float(img_range)
        self.register_buffer("mean", torch.tensor([float(m) for m in rgb_mean]).view(1, -1, 1, 1))
        self.conv_1 = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.blocks = nn.ModuleList(_SPAB(channels) for _ in range(6))
        self.conv_2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv_cat = nn.Conv2d(4 * channels, channels, 1)
        self.tail = compact_tail("SPAN", upsampler, upsampler_options, channels, in_channels, scale)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """What the tail upsamples (``forward = reconstruct(features(x), x)``)."""
        feature = self.conv_1((x - self.mean) * self.img_range)
        out, first_of_last = feature, feature
        kept = []
        for block in self.blocks:
            out, first_of_last = block(out)
            kept.append(out)
        return self.conv_cat(torch.cat([feature, self.conv_2(out), kept[0], first_of_last], 1))

    def reconstruct(self, features: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.tail(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return self.reconstruct(self.features(x), x)
