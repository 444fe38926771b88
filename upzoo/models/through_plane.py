"""Through-plane super-resolution of thick-slice volumes: a 3D network whose upsampling is one
registered block with a per-axis scale (``[4, 1, 1]``: 4 mm slices to 1 mm, in-plane untouched).

``(B, 1, D, H, W) -> (B, 1, D * s_d, H * s_h, W * s_w)``. The body works on the thick grid (cheap),
the block brings it to the thin grid, one 3x3x3 conv makes the image; with ``residual: true``
(VDSR's global residual learning, the default) the network adds its output to the linear
interpolation of the input along each scaled axis, so it learns what interpolation misses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError
from upzoo.layers import check_input_shape
from upzoo.models.stage_blocks import stage_block
from upzoo.registry import block_options

__all__ = ["ThroughPlaneSR", "volume_scale"]


def volume_scale(scale: Any, owner: str) -> tuple[int, int, int]:
    """A per-axis scale ``[s_d, s_h, s_w]`` of whole numbers >= 1, at least one above 1.

    Raises:
        ConfigError: anything else, with an example.
    """
    ok = isinstance(scale, Sequence) and not isinstance(scale, (str, bytes)) and len(scale) == 3
    ok = ok and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in scale)
    if not ok or max(scale) == 1:
        raise ConfigError(
            f"{owner}: scale must be three whole factors [D, H, W] >= 1, one of them above 1, e.g. [4, 1, 1] for "
            f"4 mm slices to 1 mm; got {scale!r}"
        )
    return tuple(int(s) for s in scale)  # type: ignore[return-value]


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv3d(channels, channels, 3, padding=1), nn.ReLU(True), nn.Conv3d(channels, channels, 3, padding=1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ThroughPlaneSR(nn.Module):
    """Head conv, ``num_blocks`` residual blocks and a conv with a long skip (EDSR's body, in 3D, on
    the thick grid), the upsampler block (``channels`` -> ``channels`` at ``scale``), a last conv to
    the image; plus the linear interpolation of the input with ``residual``.

    >>> ThroughPlaneSR(scale=[4, 1, 1], channels=8, num_blocks=1)(torch.rand(1, 1, 3, 8, 8)).shape
    torch.Size([1, 1, 12, 8, 8])

    Raises:
        ConfigError: a scale, width or depth that does not fit; a block that cannot take the scale.
    """

    def __init__(
        self, *, scale: Sequence[int], in_channels: int = 1, channels: int = 16, num_blocks: int = 4,
        upsampler: str = "pixel_shuffle", upsampler_options: dict[str, Any] | None = None, residual: bool = True,
    ) -> None:  # fmt: skip
        super().__init__()
        self.scale = volume_scale(scale, "ThroughPlaneSR")
        self.in_channels = check_positive_int(in_channels, "ThroughPlaneSR in_channels")
        channels = check_positive_int(channels, "ThroughPlaneSR channels")
        blocks = check_positive_int(num_blocks, "ThroughPlaneSR num_blocks")
        if not isinstance(residual, bool):
            raise ConfigError(f"ThroughPlaneSR residual must be true or false, got {residual!r}")
        self.residual = residual
        self.head = nn.Conv3d(self.in_channels, channels, 3, padding=1)
        self.body = nn.Sequential(
            *(_Residual(channels) for _ in range(blocks)), nn.Conv3d(channels, channels, 3, padding=1)
        )
        self.upsample = stage_block(
            upsampler, block_options(upsampler_options, "ThroughPlaneSR"), where="ThroughPlaneSR upsampler",
            in_channels=channels, out_channels=channels, scale=self.scale, spatial_dims=3,
        )  # fmt: skip
        self.last = nn.Conv3d(channels, self.in_channels, 3, padding=1)

    def interpolate(self, x: torch.Tensor) -> torch.Tensor:
        """The input on the thin grid by linear interpolation (voxel centres, ``align_corners=False``)."""
        size = [n * s for n, s in zip(x.shape[2:], self.scale)]
        return F.interpolate(x, size=size, mode="trilinear", align_corners=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input_shape(x.shape, spatial_dims=3, channels=self.in_channels, owner="ThroughPlaneSR")
        features = self.head(x)
        out = self.last(self.upsample(features + self.body(features)))
        return out + self.interpolate(x) if self.residual else out

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """``(B, C, D, H, W) -> (B, C, D * s_d, H * s_h, W * s_w)``."""
        b, c, *sizes = check_input_shape(input_shape, spatial_dims=3, channels=self.in_channels, owner="ThroughPlaneSR")
        return (b, c, *(n * s for n, s in zip(sizes, self.scale)))
