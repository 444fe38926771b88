"""Weights trained with the upsampler authors' code, loaded into upzoo blocks — and back.

Sources and their mappings, so they never have to be worked out by hand again:

* ``"carafe"``: mmcv's ``CARAFEPack`` (Wang et al., ICCV 2019): ``channel_compressor`` ->
  ``compress``, ``content_encoder`` -> ``encoder``; the kernel channels are ordered (tap,
  sub-position) in both.
* ``"fade"``: ``FADE`` of poppinace/fade (Lu et al., ECCV 2022), the mmcv-based module at the
  repository's root (``FADE_H2L.py``, the one the paper's results come from):
  ``gate_generator.conv`` -> ``gate``, ``kernel_generator.conv1_en`` -> ``compress_guide``,
  ``kernel_generator.conv1_de`` -> ``compress_x``, ``kernel_generator.conv2_kernels`` and
  ``conv2_bias`` -> ``content``. Their encoder feature is upzoo's guide, their decoder feature x.
  The repository's einops copy (``pytorch_implementation/FADE_H2L.py``) has the same keys but splits
  the four shifted encoder paddings channel-interleaved (``b (c scale_2)``) where the mmcv module
  splits them by shift: its weights compute another function, which no FADE block computes, so
  ``source="fade_pytorch"`` is refused with that reason (its keys cannot tell the two apart: say
  which one trained the weights).
* ``"sapa"``: ``SAPA`` of poppinace/sapa (Lu et al., NeurIPS 2022; SAPA-B): ``norm_y`` ->
  ``norm_guide``, ``q`` -> ``query``, ``k`` -> ``key`` (``norm_x`` keeps its name). Build the block
  with ``border="zeros"`` (the default) to compute what their kernels compute.
* ``"dysample"``, the ``DySample`` module of tiny-smart/dysample (Liu et al., ICCV 2023; ``style``
  'lp' or 'pl', any ``groups``, with or without ``dyscope``):

* offsets: the authors order the offset conv's output rows ``(x, y)`` (width axis first); upzoo
  orders them by spatial axis, ``(y, x)``. Within an axis the rows are ``(group, sub-position)`` in
  both (``lp``) or ``group`` (``pl``), so only the two axis blocks swap.
* dynamic scope: the authors' scope conv has no bias; upzoo's has one, set to 0 on loading. Going
  back, a non-zero scope bias cannot be expressed and is refused.
* ``init_pos`` (the authors' persistent buffer of sub-position offsets) is recomputed in upzoo from
  the scale and groups: loading checks a given one against it, and going back writes it, so their
  module takes the state dict with a strict ``load_state_dict``.

Every weight must be a finite floating-point tensor or array (NaN weights, strings or None are
refused naming the key).

A block built with the authors' arguments then computes what their module computes (tested against
a port of it to 1e-10 in float64, outputs and gradients).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from upzoo.errors import ConfigError, DataError

__all__ = ["load_reference_state_dict", "reference_state_dict", "init_pos", "SOURCES"]

SOURCES = ("carafe", "fade", "sapa", "dysample")

#: why the FADE repository's einops copy cannot be converted (see the module)
FADE_COPY = (
    "source 'fade_pytorch' (poppinace/fade's pytorch_implementation/FADE_H2L.py) splits the four shifted encoder "
    "paddings channel-interleaved ('b (c scale_2)') where the mmcv-based FADE_H2L.py splits them by shift: its "
    "weights compute another function, which no upzoo FADE block computes; use weights trained with the "
    "mmcv-based module (source='fade'), or retrain"
)

#: reference key -> upzoo key, for the sources that only rename
RENAMES: dict[str, dict[str, str]] = {
    "carafe": {
        "channel_compressor.weight": "compress.weight",
        "channel_compressor.bias": "compress.bias",
        "content_encoder.weight": "encoder.weight",
        "content_encoder.bias": "encoder.bias",
    },
    "fade": {
        "gate_generator.conv.weight": "gate.weight",
        "gate_generator.conv.bias": "gate.bias",
        "kernel_generator.conv1_en.weight": "compress_guide.weight",
        "kernel_generator.conv1_en.bias": "compress_guide.bias",
        "kernel_generator.conv1_de.weight": "compress_x.weight",
        "kernel_generator.conv2_kernels": "content.weight",
        "kernel_generator.conv2_bias": "content.bias",
    },
    "sapa": {
        "norm_y.weight": "norm_guide.weight",
        "norm_y.bias": "norm_guide.bias",
        "norm_x.weight": "norm_x.weight",
        "norm_x.bias": "norm_x.bias",
        "q.weight": "query.weight",
        "q.bias": "query.bias",
        "k.weight": "key.weight",
        "k.bias": "key.bias",
    },
}


def _swap_axes(weight: torch.Tensor, spatial_dims: int) -> torch.Tensor:
    """Reverse the order of the ``spatial_dims`` equal blocks of rows: (x, y) <-> (y, x)."""
    blocks = weight.reshape(spatial_dims, -1, *weight.shape[1:])
    return blocks.flip(0).reshape(weight.shape)


def _check_source(block: nn.Module, source: str) -> None:
    from upzoo.registry import UPSAMPLERS

    if source == "fade_pytorch":
        raise ConfigError(FADE_COPY)
    if source not in SOURCES:
        raise ConfigError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    expected = UPSAMPLERS.info(source).factory
    if type(block) is not expected or block.spatial_dims != 2:
        raise ConfigError(f"source {source!r} converts into a 2D {source} block, got {type(block).__name__}")
    if getattr(block, "proj", None) is not None:
        raise ConfigError(
            f"the reference {source} keeps the channels: build the block with out_channels == in_channels"
        )
    if source == "fade" and (block.gate is None or block.align is not None):
        raise ConfigError(
            "the reference FADE has a gate and a guide of the block's width: gate=True, guide_channels == in_channels"
        )
    if source == "dysample" and len(set(block.scale)) != 1:
        raise ConfigError(f"the reference DySample takes one scale for both axes, got a block of scale {block.scale}")
    if source == "sapa" and block.variant != "bilinear":
        raise ConfigError("the reference SAPA is SAPA-B: build the block with variant='bilinear'")


def _weight(value: Any, source: str, key: str) -> torch.Tensor:
    """A weight of the authors' state dict as a tensor: floating-point and finite."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        shown = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
        raise DataError(f"{source} state_dict[{key!r}] must be a floating-point tensor or array, got {shown}")
    bad = int((~torch.isfinite(value)).sum())
    if bad:
        raise DataError(
            f"{source} state_dict[{key!r}]: {bad} of {value.numel()} values are NaN or infinite: broken weights"
        )
    return value


def init_pos(scale: int, groups: int) -> torch.Tensor:
    """The authors' DySample ``init_pos`` buffer ``(1, 2 * groups * scale², 1, 1)``, computed as
    theirs is (float32): each sub-position's offset from its source point, ``(x, y)`` rows."""
    h = torch.arange((-scale + 1) / 2, (scale - 1) / 2 + 1) / scale
    grid = torch.stack(torch.meshgrid([h, h], indexing="ij")).transpose(1, 2)
    return grid.repeat(1, groups, 1).reshape(1, -1, 1, 1)


def _renamed(block: nn.Module, state_dict: Mapping[str, Any], source: str) -> dict[str, torch.Tensor]:
    mapping, own = RENAMES[source], block.state_dict()
    given = set(state_dict)
    if given != set(mapping):
        missing, extra = sorted(set(mapping) - given), sorted(given - set(mapping))
        raise DataError(
            f"{source} state_dict does not fit: missing {missing or 'nothing'}, unexpected {extra or 'nothing'}"
        )
    converted = {}
    for theirs, ours in mapping.items():
        value = _weight(state_dict[theirs], source, theirs)
        if value.shape != own[ours].shape:
            raise DataError(
                f"{source} {theirs} has shape {tuple(value.shape)}, this block's {ours} {tuple(own[ours].shape)}"
            )
        converted[ours] = value
    return converted


def load_reference_state_dict(block: nn.Module, state_dict: Mapping[str, Any], *, source: str) -> nn.Module:
    """Load ``state_dict`` of the authors' module (``source``) into ``block``; returns ``block``.

    Raises:
        ConfigError: an unknown source, or a block that cannot hold the reference's weights.
        DataError: missing, unexpected or misshapen keys, named with both shapes.
    """
    _check_source(block, source)
    if not isinstance(state_dict, Mapping):
        raise ConfigError(f"state_dict must be a mapping of weight names to tensors, got {type(state_dict).__name__}")
    if source in RENAMES:
        block.load_state_dict(_renamed(block, state_dict, source))
        return block
    expected = {"offset.weight", "offset.bias"} | ({"scope.weight"} if block.scope is not None else set())
    given = {k for k in state_dict if k != "init_pos"}
    if given != expected:
        missing, extra = sorted(expected - given), sorted(given - expected)
        raise DataError(
            f"{source} state_dict does not fit this block (dynamic_scope={block.dynamic_scope}): "
            f"missing {missing or 'nothing'}, unexpected {extra or 'nothing'}"
        )
    own = block.state_dict()
    converted = {}
    for key in sorted(expected):
        value = _weight(state_dict[key], source, key)
        if value.shape != own[key].shape:
            raise DataError(f"{source} {key} has shape {tuple(value.shape)}, this block {tuple(own[key].shape)}")
        converted[key] = _swap_axes(value, 2)
    if "init_pos" in state_dict:
        _check_init_pos(block, _weight(state_dict["init_pos"], source, "init_pos"))
    if block.scope is not None:
        converted["scope.bias"] = torch.zeros_like(own["scope.bias"])
    block.load_state_dict(converted)
    return block


def _check_init_pos(block: nn.Module, given: torch.Tensor) -> None:
    expected = init_pos(block.scale[0], block.groups)
    if given.shape != expected.shape or not torch.allclose(given.double(), expected.double(), atol=1e-6):
        raise DataError(
            f"dysample init_pos {tuple(given.shape)} is not the one of scale {block.scale[0]} and {block.groups} "
            f"group(s) {tuple(expected.shape)}: the state dict is of another DySample"
        )


def reference_state_dict(block: nn.Module, *, source: str) -> dict[str, torch.Tensor]:
    """``block``'s weights as a state dict of the authors' module (``source``), e.g. to take a block
    trained in upzoo back into a codebase built on their module: every key of theirs, buffers
    included, so a strict ``load_state_dict`` takes it.

    Raises:
        ConfigError: an unknown source, or weights the reference cannot express (a non-zero scope bias).
    """
    _check_source(block, source)
    own = block.state_dict()
    if source in RENAMES:
        return {theirs: own[ours].detach().clone() for theirs, ours in RENAMES[source].items()}
    out = {"offset.weight": _swap_axes(own["offset.weight"], 2), "offset.bias": _swap_axes(own["offset.bias"], 2)}
    if block.scope is not None:
        if bool(own["scope.bias"].any()):
            raise ConfigError("this block's scope.bias is not zero; the authors' scope conv has no bias")
        out["scope.weight"] = _swap_axes(own["scope.weight"], 2)
    out["init_pos"] = init_pos(block.scale[0], block.groups).to(own["offset.bias"].dtype)
    return {k: v.detach().clone() for k, v in out.items()}
