"""The one way a model builds the block at one of its upsampling places: the registered block by
name with its options, the guide the place has (a guided block where there is none is refused),
its warnings pointed at the model's caller, and its output checked to be exactly input x scale
(the model adds, concatenates or stacks it on features of that size). upzoo's U-Net, smp's U-Net,
the smp decoders' points, the DCGAN generator's and PGGAN's stages all build their blocks here; the
post-filter on a model's output too (:func:`post_filter_block`)."""

from __future__ import annotations

from typing import Any

from torch import nn

from upzoo.errors import ConfigError
from upzoo.registry import create_upsampler
from upzoo.runtime import warnings_at_caller
from upzoo.upsamplers.guides import guide_options

__all__ = ["stage_block", "check_exact_scale", "post_filter_block"]


def stage_block(
    name: str,
    options: dict[str, Any],
    *,
    where: str,
    in_channels: int,
    out_channels: int,
    scale: int,
    guide_channels: int = 0,
    spatial_dims: int = 2,
    options_key: str = "upsampler_options",
    exact: bool = True,
) -> nn.Module:
    """The block ``name`` with ``options`` for the place ``where`` (named in every message; the
    block's warnings also name the model argument its options came from, ``options_key``).
    ``exact=False`` leaves the output size to the caller: upzoo's U-Net checks every stage against
    its skip at each input size instead (its size rule, :mod:`upzoo.models.sizes`).

    Raises:
        ConfigError: a guided block where no guide exists, or an output that is not exactly input x
            scale. RegistryError: an unknown block or option.
    """
    guide = guide_options(name, guide_channels, where)
    with warnings_at_caller(f"{where} ({options_key}): "):
        block = create_upsampler(name, spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels,
                                 scale=scale, **guide, **options)  # fmt: skip
    if exact:
        check_exact_scale(block, where)
    return block


def check_exact_scale(block: nn.Module, where: str) -> None:
    """``block`` maps sizes 5 and 8 to exactly 5 x scale and 8 x scale on every axis.

    Raises:
        ConfigError: naming the place, the size and what came out.
    """
    for n in (5, 8):
        out = tuple(block.output_shape((1, block.in_channels, *(n,) * block.spatial_dims))[2:])
        wanted = tuple(n * s for s in block.scale)
        if out != wanted:
            raise ConfigError(
                f"{where}: {type(block).__name__} maps size {n} to {'x'.join(map(str, out))}, the model needs exactly "
                f"{'x'.join(map(str, wanted))} (input x scale); use options whose output is input x scale (transposed: "
                f"kernel_size = scale, or kernel_size=4, padding=1 at scale 2)"
            )


def post_filter_block(name: str | None, options: dict[str, Any] | None, *, channels: int, spatial_dims: int = 2,
                      where: str = "post_filter") -> nn.Module | None:  # fmt: skip
    """The registered post-filter ``name`` (a scale-1 block that keeps ``channels``) with ``options``,
    or ``None`` when ``name`` is empty.

    Raises:
        RegistryError: an unknown block or option. ConfigError: a block that is not scale 1.
    """
    if not name:
        return None
    with warnings_at_caller(f"{where} (post_filter_options): "):
        return create_upsampler(name, spatial_dims=spatial_dims, in_channels=channels, out_channels=channels,
                                scale=1, **(options or {}))  # fmt: skip
