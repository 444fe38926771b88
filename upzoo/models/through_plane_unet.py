"""Segmentation at the thin spacing from thick slices: upzoo's 3D U-Net on the thick grid, then one
registered block with a per-axis scale (``[4, 1, 1]``: 4 mm slices to 1 mm labels) and a head on the
thin grid.

``(B, 1, D, H, W) -> (B, num_classes, D * s_d, H * s_h, W * s_w)``. The U-Net (strides planned from
the thick spacing with ``strides: auto``, in-plane stages first) ends in its last decoder features
instead of its 1x1 head; the block brings them to the thin grid, two conv-norm-act layers refine
them there and a 1x1 conv gives the class logits. The upsampler named in the recipe is every
upsampling of the network, the U-Net's decoder stages and the through-plane block, so a comparison
of blocks swaps them all. ``through_plane_upsampler`` (with its own options) sets the through-plane
block alone: a guided block (``fade``, ``sapa``) then upsamples the decoder stages with the encoder
skip as its guide, while the through-plane block, which has no skip on the thin grid, stays unguided.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError
from upzoo.layers import check_input_shape
from upzoo.models.blocks import DoubleConv
from upzoo.models.stage_blocks import stage_block
from upzoo.models.through_plane import volume_scale
from upzoo.models.unet import UNet
from upzoo.registry import UPSAMPLERS, block_options

__all__ = ["ThroughPlaneUNet"]


class ThroughPlaneUNet(nn.Module):
    """A 3D U-Net on the thick grid, the through-plane block, a head on the thin grid (see the module).

    >>> net = ThroughPlaneUNet(scale=[4, 1, 1], num_classes=4, channels=[8, 16], strides=[[1, 2, 2]])
    >>> net(torch.rand(1, 1, 3, 8, 10)).shape
    torch.Size([1, 4, 12, 8, 10])

    Raises:
        ConfigError / RegistryError: a scale, width or block that does not fit (named, with the fix).
    """

    def __init__(
        self, *, scale: Sequence[int], num_classes: int, in_channels: int = 1,
        channels: Sequence[int] = (16, 32, 64, 128), strides: Sequence[Sequence[int]] | None = None,
        upsampler: str = "transposed", upsampler_options: dict[str, Any] | None = None,
        through_plane_upsampler: str | None = None, through_plane_upsampler_options: dict[str, Any] | None = None,
        norm: str = "instance", act: str = "relu",
    ) -> None:  # fmt: skip
        super().__init__()
        self.scale = volume_scale(scale, "ThroughPlaneUNet")
        self.num_classes = check_positive_int(num_classes, "ThroughPlaneUNet num_classes")
        options = _options(upsampler, upsampler_options, "upsampler")
        block, block_opts = _through_plane_block(
            upsampler, options, through_plane_upsampler, through_plane_upsampler_options
        )
        if isinstance(channels, Sequence) and not isinstance(channels, (str, bytes)) and channels:
            width = channels[0]  # the U-Net's last decoder stage mirrors its first encoder stage
        else:
            width = channels  # UNet names what is wrong with it
        self.unet = UNet(spatial_dims=3, in_channels=in_channels, num_classes=1, channels=channels, strides=strides,
                         upsampler=upsampler, upsampler_options=options, norm=norm, act=act)  # fmt: skip
        self.unet.head = nn.Identity()  # its last decoder features (``width`` channels) go on
        self.in_channels = in_channels
        self.upsample = stage_block(block, block_opts, where="ThroughPlaneUNet through-plane block", in_channels=width,
                                    out_channels=width, scale=self.scale, spatial_dims=3)  # fmt: skip
        self.refine = DoubleConv(3, width, width, norm=norm, act=act)
        self.head = nn.Conv3d(width, self.num_classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, in_channels, D, H, W)`` thick slices -> ``(B, num_classes, *thin)`` logits."""
        check_input_shape(x.shape, spatial_dims=3, channels=self.in_channels, owner="ThroughPlaneUNet")
        return self.head(self.refine(self.upsample(self.unet(x))))

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """``(B, C, D, H, W) -> (B, num_classes, D * s_d, H * s_h, W * s_w)``."""
        b, _, *sizes = check_input_shape(
            input_shape, spatial_dims=3, channels=self.in_channels, owner="ThroughPlaneUNet"
        )
        return (b, self.num_classes, *(n * s for n, s in zip(sizes, self.scale)))


def _options(name: Any, options: Any, key: str) -> dict[str, Any]:
    """The checked block name and options of ``key`` (``upsampler`` or ``through_plane_upsampler``)."""
    if not isinstance(name, str):
        raise ConfigError(f"ThroughPlaneUNet {key}: one block name, got {name!r}")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"ThroughPlaneUNet {key}_options: one mapping of the block's options, got {options!r}")
    return block_options(options, "ThroughPlaneUNet")


def _through_plane_block(
    upsampler: str, options: dict[str, Any], name: str | None, block_opts: dict[str, Any] | None
) -> tuple[str, dict[str, Any]]:
    """The through-plane block and its options: ``through_plane_upsampler`` where given, else the
    network's ``upsampler``; a guided one is refused (the thin grid has no encoder skip)."""
    if name is None:
        if block_opts is not None:
            raise ConfigError(
                "ThroughPlaneUNet through_plane_upsampler_options without a through_plane_upsampler; name the "
                "through-plane block (through_plane_upsampler), or set every block's options with upsampler_options"
            )
        name, checked, key = upsampler, options, "upsampler"
    else:
        checked, key = _options(name, block_opts, "through_plane_upsampler"), "through_plane_upsampler"
    if UPSAMPLERS.info(name).needs_guide:
        fix = (
            f"keep {upsampler!r} for the decoder stages and set an unguided through-plane block, e.g. "
            f"through_plane_upsampler: transposed"
            if key == "upsampler"
            else "use an unguided block, e.g. transposed"
        )
        raise ConfigError(
            f"ThroughPlaneUNet {key} {name!r} is guided by an encoder skip, and the through-plane block has none "
            f"on the thin grid (the input is the thick slices); {fix}"
        )
    return name, checked
