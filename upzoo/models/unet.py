"""U-Net for 2D images and 3D volumes, every decoder stage a registered upsampler."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from upzoo.checks import check_bool, check_positive_int
from upzoo.errors import ConfigError, ShapeError
from upzoo.layers import check_input_shape, conv_nd, crop_start, pad_end
from upzoo.models.attention_gate import AttentionGate
from upzoo.models.blocks import DoubleConv
from upzoo.models.checkpointing import checkpointed
from upzoo.models.encoders import Encoder, create_encoder, stage_scales
from upzoo.models.sizes import AxisRule, InputPolicy, check_input_policy, find_axis_rule, policy_size
from upzoo.models.stage_blocks import post_filter_block, stage_block
from upzoo.registry import block_options
from upzoo.upsamplers.guides import upsample

__all__ = ["UNet", "DecoderStage"]

SMP_DECODER_CHANNELS = (256, 128, 64, 32, 16)


class DecoderStage(nn.Module):
    """Upsample (a registered block) -> concatenate the skip (if any) -> two conv-norm-act layers.

    ``(B, C_in, *S), skip (B, C_skip, *S * scale) -> (B, C_out, *S * scale)``. The upsampler keeps
    the channel count, so every upsampler is compared inside the same decoder convolutions; a guided
    upsampler (FADE, SAPA) takes the skip as its guide. With ``attention``, an
    :class:`~upzoo.models.attention_gate.AttentionGate` gated by the upsampled features weighs the
    skip before the concatenation (a stage without a skip has none).
    """

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        skip_channels: int,
        out_channels: int,
        *,
        scale: tuple[int, ...],
        upsampler: str,
        upsampler_options: dict[str, Any],
        norm: str,
        act: str,
        name: str = "decoder stage",
        attention: bool = False,
    ) -> None:
        super().__init__()
        self.upsample = stage_block(upsampler, upsampler_options, where=name, in_channels=in_channels,
                                    out_channels=in_channels, scale=scale, guide_channels=skip_channels,
                                    spatial_dims=spatial_dims, exact=False)  # fmt: skip
        self.conv = DoubleConv(spatial_dims, in_channels + skip_channels, out_channels, norm=norm, act=act)
        gated = attention and skip_channels > 0
        self.attention = AttentionGate(spatial_dims, in_channels, skip_channels, norm=norm) if gated else None

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        x = upsample(self.upsample, x, skip)  # a guided block is guided by the skip
        if skip is not None and self.attention is not None:
            skip = self.attention(x, skip)  # gated by the upsampled features
        if skip is not None:
            x = torch.cat([x, skip], dim=1)
        return self.conv(x)


def per_stage(value: Any, n: int, name: str, default: Any) -> list[Any]:
    if value is None:
        return [default] * n
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ConfigError(f"{name} as a list needs one entry per decoder stage ({n}), got {len(value)}")
        return [default if v is None else v for v in value]
    return [value] * n


def _check_arguments(
    spatial_dims, in_channels, num_classes, encoder_depth, channels, decoder_channels, input_policy
) -> None:
    """UNet's arguments, checked once with the value named.

    Raises:
        ConfigError: a value of the wrong type or range (an empty list is not "unset").
    """
    if spatial_dims not in (2, 3) or isinstance(spatial_dims, bool):
        raise ConfigError(f"UNet supports spatial_dims 2 or 3, got {spatial_dims!r}")
    check_positive_int(in_channels, "in_channels")
    check_positive_int(num_classes, "num_classes")
    check_positive_int(encoder_depth, "encoder_depth")
    for key, values in (("channels", channels), ("decoder_channels", decoder_channels)):
        if values is not None and (isinstance(values, (str, bytes)) or not isinstance(values, Sequence)):
            raise ConfigError(f"UNet {key} must be a list of positive ints or None, got {values!r}")
        if values is not None and len(values) == 0:
            raise ConfigError(f"UNet {key} is an empty list; give one width per stage, or None for the default")
        for i, value in enumerate(values or ()):
            check_positive_int(value, f"{key}[{i}]")
    check_input_policy(input_policy)


class UNet(nn.Module):
    """U-Net: encoder -> decoder of :class:`DecoderStage` -> 1x1 head (-> optional post-filter).

    ``(B, in_channels, *S) -> (B, num_classes, *S)`` for any ``S``: with ``input_policy="pad"`` the
    input is zero-padded at the end of each axis to the next multiple of the encoder's total
    reduction and the output cropped back; ``"strict"`` raises :class:`ShapeError` naming the nearest
    valid sizes.

    Args:
        spatial_dims: 2 or 3.
        in_channels: input channels.
        num_classes: output classes.
        encoder: ``"plain"`` (2D/3D), a segmentation-models-pytorch encoder name (``"resnet34"``) or
            ``"tu-<timm model>"`` (2D).
        encoder_weights: ``None`` (random init, default) or a local state-dict file; never downloaded.
        encoder_depth: stages of an smp/timm encoder.
        channels: the plain encoder's stage channels.
        strides: the plain encoder's per-stage (per-axis) strides, e.g. from
            :func:`~upzoo.models.plan_strides`; the decoder mirrors them.
        upsampler: a registered block name, or one per decoder stage (deepest first).
        upsampler_options: the block's options, or one dict per decoder stage.
        decoder_channels: output channels of each decoder stage (deepest first).
        post_filter: a registered post-filter (e.g. ``masked_blur``) on the output.
        post_filter_options: its options.
        norm: normalisation of the conv blocks.
        act: activation of the conv blocks.
        checkpointing: gradient checkpointing per encoder and decoder stage while training.
        attention_gates: an attention gate on every skip (Oktay et al. 2018), gated by the stage's
            upsampled features (:class:`~upzoo.models.attention_gate.AttentionGate`), after any block.
        deep_supervision: extra 1x1 heads on the decoder stages: ``forward(x, aux=True)`` returns
            ``[main, aux_1, ...]`` (aux outputs at their own, lower resolution); ``forward(x)`` returns
            the main output as every model does (until the next release, a model in training mode
            called without ``aux`` still returns the list, with a ``FutureWarning``).

    Raises:
        ConfigError / RegistryError: inconsistent options, unknown encoder or upsampler names.

    >>> net = UNet(spatial_dims=3, in_channels=1, num_classes=3, channels=(8, 16, 32),
    ...            strides=[(1, 2, 2), (2, 2, 2)], upsampler="pixel_shuffle")
    >>> net(torch.zeros(1, 1, 7, 30, 33)).shape
    torch.Size([1, 3, 7, 30, 33])
    """

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        num_classes: int,
        encoder: str = "plain",
        encoder_weights: str | None = None,
        encoder_depth: int = 5,
        channels: Sequence[int] | None = None,
        strides: Sequence[int | Sequence[int]] | None = None,
        upsampler: str | Sequence[str] = "transposed",
        upsampler_options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
        decoder_channels: Sequence[int] | None = None,
        post_filter: str | None = None,
        post_filter_options: dict[str, Any] | None = None,
        norm: str = "batch",
        act: str = "relu",
        input_policy: InputPolicy = "pad",
        checkpointing: bool = False,
        deep_supervision: bool = False,
        attention_gates: bool = False,
    ) -> None:
        super().__init__()
        _check_arguments(
            spatial_dims, in_channels, num_classes, encoder_depth, channels, decoder_channels, input_policy
        )
        self.spatial_dims, self.in_channels, self.num_classes = spatial_dims, in_channels, num_classes
        self.input_policy, self.checkpointing, self.deep_supervision = input_policy, checkpointing, deep_supervision
        self.encoder: Encoder = create_encoder(
            encoder,
            spatial_dims=spatial_dims,
            in_channels=in_channels,
            channels=channels,
            strides=strides,
            depth=encoder_depth,
            weights=encoder_weights,
            norm=norm,
            act=act,
        )

        self.attention_gates = check_bool(attention_gates, "attention_gates")
        decoder_channels = self._build_decoder(encoder, upsampler, upsampler_options, decoder_channels, norm, act)
        conv = conv_nd(spatial_dims)
        self.head = conv(decoder_channels[-1], num_classes, kernel_size=1)
        self.aux_heads = (
            nn.ModuleList(conv(c, num_classes, kernel_size=1) for c in decoder_channels[:-1])
            if deep_supervision
            else None
        )
        self.post_filter = post_filter_block(post_filter, post_filter_options, channels=num_classes,
                                             spatial_dims=spatial_dims, where="UNet post_filter")  # fmt: skip
        self.size_rules: tuple[AxisRule, ...] = tuple(self._axis_rule(a) for a in range(spatial_dims))

    def _build_decoder(self, encoder, upsampler, upsampler_options, decoder_channels, norm, act) -> list[int]:
        """One :class:`DecoderStage` per encoder stage (deepest first); returns their channels."""
        spatial_dims = self.spatial_dims
        scales = stage_scales(self.encoder)  # deepest first
        skips = self.encoder.channels[::-1][1:]
        first = self.encoder.reductions[0]
        if any(r > 1 for r in first):  # smp/timm encoders start at stride 2: one more stage, no skip
            scales.append(first)
            skips.append(0)
        n = len(scales)
        if decoder_channels is None:  # mirror the plain encoder; smp's defaults for smp/timm encoders
            decoder_channels = skips if encoder == "plain" else list(SMP_DECODER_CHANNELS[:n])
        if len(decoder_channels) != n:
            raise ConfigError(
                f"decoder_channels needs {n} entries (one per decoder stage), got {list(decoder_channels)}"
            )
        names = per_stage(upsampler, n, "upsampler", "transposed")
        if isinstance(upsampler_options, (Mapping, str)) or upsampler_options is None:
            options = [block_options(upsampler_options, "UNet") for _ in range(n)]
        else:
            stages = per_stage(list(upsampler_options), n, "upsampler_options", {})
            options = [block_options(o, f"UNet decoder stage {i}") for i, o in enumerate(stages)]
        ins = [self.encoder.channels[-1]] + list(decoder_channels[:-1])
        stages = []
        for index, (i, s, o, sc, name, opt) in enumerate(zip(ins, skips, decoder_channels, scales, names, options)):
            stages.append(DecoderStage(spatial_dims, i, s, o, scale=sc, upsampler=name, upsampler_options=opt,
                                       norm=norm, act=act, name=f"UNet decoder stage {index}",
                                       attention=self.attention_gates))  # fmt: skip
        self.decoder = nn.ModuleList(stages)
        return list(decoder_channels)

    # -- sizes -------------------------------------------------------------------------------------
    @property
    def size_multiple(self) -> tuple[int, ...]:
        """Per axis, the step between valid input sizes (see :attr:`size_rules`)."""
        return tuple(rule.multiple for rule in self.size_rules)

    def axis_valid(self, axis: int, n: int) -> bool:
        """Whether size ``n`` on ``axis`` runs natively: every decoder stage's analytic output
        equals the skip it is concatenated with (and the last one the input size)."""
        return self._first_mismatch(axis, n) is None

    def _first_mismatch(self, axis: int, n: int) -> str | None:
        features = self.encoder.feature_sizes(axis, n)
        targets = features[::-1][1:] + ([n] if len(self.decoder) == len(features) else [])
        y = features[-1]
        for i, (stage, target) in enumerate(zip(self.decoder, targets)):
            try:
                y = stage.upsample.output_spatial((y,) * self.spatial_dims)[axis]
            except ShapeError:
                y = 0
            if y != target:
                return f"decoder stage {i} ({type(stage.upsample).__name__}) makes {y} where its skip has {target}"
        return None

    def _axis_rule(self, axis: int) -> AxisRule:
        """The valid sizes on ``axis`` as a rule; a U-Net that runs at no size (or at an irregular
        set of sizes) is refused here, at construction."""
        reduction = self.encoder.reductions[-1][axis]
        limit = 8 * reduction + 64
        rule, sizes = find_axis_rule(lambda n: self.axis_valid(axis, n), limit)
        if rule is None:
            probe = 4 * reduction
            found = f"only at sizes {sizes}" if sizes else "at no size"
            raise ConfigError(
                f"this U-Net runs {found} in 1..{limit} on axis {axis}: at input size {probe} "
                f"{self._first_mismatch(axis, probe)}; use upsampler options whose output is input x scale "
                f"(for transposed: kernel_size = scale, padding 0, or kernel_size=4, padding=1 at scale 2)"
            )
        return rule

    def padded_size(self, spatial: Sequence[int]) -> tuple[int, ...]:
        """The size the network runs at for input size ``spatial``: the nearest valid size at or
        above it per axis (``input_policy='pad'``), or ``spatial`` itself if valid.

        Raises:
            ShapeError: an invalid size under ``input_policy='strict'``, naming the nearest valid sizes.
        """
        return policy_size(tuple(spatial), self.size_rules, self.input_policy)

    # -- forward -----------------------------------------------------------------------------------
    def _run(self, module: nn.Module, *args: torch.Tensor | None):
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return checkpointed(module, *args)
        return module(*args)

    def _encode(self, x: torch.Tensor) -> list[torch.Tensor]:
        stages = self.encoder.stages()
        if stages is None:
            return self._run(self.encoder, x)
        features = []
        for stage in stages:
            x = self._run(stage, x)
            features.append(x)
        return features

    def _padding(self, spatial: tuple) -> list:
        """Per axis, what the input policy adds to reach a valid size. Traced (``torch.compile``,
        ``torch.export``, ONNX), sizes may be symbolic and the graph pads always, by an amount
        computed from the size, so it holds for every input size (a graph cannot raise: traced,
        ``input_policy='strict'`` pads too)."""
        if torch.compiler.is_compiling():
            return [rule.padding(s) for s, rule in zip(spatial, self.size_rules)]
        return [t - s for s, t in zip(spatial, self.padded_size(spatial))]

    def forward(self, x: torch.Tensor, aux: bool | None = None) -> torch.Tensor | list[torch.Tensor]:
        """``(B, in_channels, *S) -> (B, num_classes, *S)`` logits; with ``aux=True`` (deep
        supervision) ``[main, aux_1, ...]``. (``aux`` is positional too: tracers that pass every
        default positionally then reach the model's own checks.)

        Raises:
            ShapeError: an input of other dims or channels, or a size ``input_policy="strict"`` refuses.
            ConfigError: ``aux=True`` on a model built without ``deep_supervision``.
        """
        if aux and self.aux_heads is None:
            raise ConfigError(
                "UNet.forward(aux=True) returns the deep-supervision outputs: build with deep_supervision=True"
            )
        if aux is None and self.aux_heads is not None and self.training:
            warnings.warn(
                "UNet with deep_supervision in training mode: forward(x) will return the main output only in the "
                "next release; call forward(x, aux=True) for [main, aux_1, ...]",
                FutureWarning,
                stacklevel=2,
            )
            aux = True
        check_input_shape(x.shape, spatial_dims=self.spatial_dims, channels=self.in_channels, owner="UNet")
        spatial = tuple(x.shape[2:])
        padding = self._padding(spatial)
        pad_and_crop = torch.compiler.is_compiling() or any(padding)
        if pad_and_crop:
            x = pad_end(x, padding)
        features = self._encode(x)
        y = features[-1]
        skips = features[::-1][1:]
        outputs = []
        for i, stage in enumerate(self.decoder):
            y = self._run(stage, y, skips[i] if i < len(skips) else None)
            outputs.append(y)
        out = self.head(y)
        if self.post_filter is not None:
            out = self.post_filter(out)
        if pad_and_crop:
            out = crop_start(out, spatial)
        if aux:
            return [out, *self._aux_outputs(outputs[:-1], spatial, padding)]
        return out

    def _aux_outputs(self, features: list[torch.Tensor], spatial: tuple, padding: list) -> list[torch.Tensor]:
        """Deep supervision: each earlier stage's head, cropped like the output (rounded up)."""
        aux = []
        for head, feature in zip(self.aux_heads, features):
            reduction = [(s + p) // f for s, p, f in zip(spatial, padding, feature.shape[2:])]
            crop = tuple(slice(0, -(-s // r)) for s, r in zip(spatial, reduction))
            aux.append(head(feature)[(slice(None), slice(None)) + crop])
        return aux
