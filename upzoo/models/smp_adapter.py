"""segmentation-models-pytorch's ``Unet`` with its decoder upsampling replaced by a registered block."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from upzoo.errors import ConfigError, ShapeError
from upzoo.layers import check_input_shape, check_positive_int, crop_start, pad_end
from upzoo.models.unet import per_stage
from upzoo.registry import create_upsampler
from upzoo.runtime import warnings_at_caller
from upzoo.upsamplers.guides import guide_options, upsample

__all__ = ["smp_unet", "UpsamplerUnetDecoderBlock"]


class UpsamplerUnetDecoderBlock(nn.Module):
    """smp's ``UnetDecoderBlock`` with ``F.interpolate`` replaced by ``upsample`` (a registered block).

    Keeps smp's submodule names (``conv1``, ``attention1``, ``conv2``, ``attention2``) so smp
    checkpoints load into it; the upsampler adds ``upsample.*``.
    """

    def __init__(self, block: nn.Module, upsample: nn.Module) -> None:
        super().__init__()
        self.upsample = upsample
        self.conv1, self.attention1 = block.conv1, block.attention1
        self.conv2, self.attention2 = block.conv2, block.attention2

    def forward(
        self,
        feature_map: torch.Tensor,
        target_height: int,
        target_width: int,
        skip_connection: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = upsample(self.upsample, feature_map, skip_connection)  # a guided block is guided by the skip
        if tuple(x.shape[2:]) != (target_height, target_width):
            raise ShapeError(
                f"upsampled decoder feature {tuple(x.shape[2:])} does not match the skip size "
                f"{(target_height, target_width)}; use input sizes divisible by the encoder's output stride"
            )
        if skip_connection is not None:
            x = self.attention1(torch.cat([x, skip_connection], dim=1))
        return self.attention2(self.conv2(self.conv1(x)))


def smp_unet(
    encoder_name: str = "resnet34",
    *,
    upsampler: str | Sequence[str] = "interpolate",
    upsampler_options: dict[str, Any] | None = None,
    classes: int = 1,
    in_channels: int = 3,
    **smp_kwargs: Any,
) -> nn.Module:
    """An ``smp.Unet`` whose decoder blocks upsample with a registered block (x2 each); one name,
    or one per decoder block (deepest first). A guided block (``fade``, ``sapa``) takes the block's
    skip as its guide; the last block has no skip, so it needs an unguided one there.

    Each upsampler keeps the channel count, so smp's decoder convolutions are unchanged; with
    ``upsampler="interpolate"`` and ``mode="nearest"`` the model computes exactly what ``smp.Unet``
    computes with the same weights. ``encoder_weights`` defaults to ``None``: nothing is downloaded.

    >>> net = smp_unet("resnet18", upsampler="pixel_shuffle", classes=3)  # doctest: +SKIP

    Raises:
        ConfigError: ``encoder_weights`` other than None (load local weights into ``net.encoder``).
    """

    check_positive_int(classes, "classes")
    check_positive_int(in_channels, "in_channels")
    weights = smp_kwargs.pop("encoder_weights", None)
    if weights is not None:
        raise ConfigError(
            "smp_unet never downloads weights: pass encoder_weights=None and load a local file with "
            "upzoo.models.encoders.load_encoder_weights(net.encoder, path)"
        )
    model = _padding_unet()(encoder_name, encoder_weights=None, classes=classes, in_channels=in_channels, **smp_kwargs)
    options = dict(upsampler_options or {})
    blocks = model.decoder.blocks
    names = per_stage(upsampler, len(blocks), "upsampler", "interpolate")
    for i, (block, name) in enumerate(zip(blocks, names)):
        skip = _skip_channels(model, i)
        channels = block.conv1[0].in_channels - skip
        guide = guide_options(name, skip, f"smp_unet decoder block {i}")
        with warnings_at_caller(f"smp_unet decoder block {i} (upsampler_options): "):
            up = create_upsampler(
                name, spatial_dims=2, in_channels=channels, out_channels=channels, scale=2, **guide, **options
            )
        blocks[i] = UpsamplerUnetDecoderBlock(block, up)
    return model


@functools.cache
def _padding_unet() -> type[nn.Module]:
    """``smp.Unet`` that takes any input size: it pads up to a multiple of the encoder's output
    stride (zeros, bottom/right) and crops the logits back, as upzoo's own U-Net does. The state
    dict is smp's. Traced, the graph always pads, by an amount computed from the (symbolic) size."""
    import segmentation_models_pytorch as smp

    class PaddingUnet(smp.Unet):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            check_input_shape(x.shape, spatial_dims=2, channels=None, owner="smp_unet")
            stride = self.encoder.output_stride
            h, w = x.shape[2:]
            pad_h, pad_w = ((h + stride - 1) // stride) * stride - h, ((w + stride - 1) // stride) * stride - w
            traced = torch.compiler.is_compiling()
            if not (traced or pad_h or pad_w):
                return super().forward(x)
            return crop_start(super().forward(pad_end(x, [pad_h, pad_w])), (h, w))

    PaddingUnet.__name__ = PaddingUnet.__qualname__ = "Unet"
    return PaddingUnet


def _skip_channels(model: nn.Module, index: int) -> int:
    encoder_channels = list(model.encoder.out_channels[1:])[::-1]
    skips = encoder_channels[1:] + [0]
    return skips[index] if index < len(skips) else 0
