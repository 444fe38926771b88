"""The upsampling points of a decoder and the registered blocks chosen for them.

A decoder (FPN, UPerNet, SegFormer's head, DeepLabV3+) upsamples at a few named *points*, each a
group of places with the same role (``top_down``: FPN's x2 merges, ``head``: the logits to the input
size, ...). :func:`build_point_blocks` turns a model's ``upsampler`` / ``upsampler_options`` into
one block per place: a point the user leaves alone keeps the resize smp does there, so
``upsampler="interpolate"`` without options computes what the smp decoder computes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from upzoo.errors import ConfigError, did_you_mean
from upzoo.models.stage_blocks import stage_block
from upzoo.registry import block_options

__all__ = ["Place", "PointInfo", "build_point_blocks", "point_groups"]


@dataclass(frozen=True)
class Place:
    """One place a decoder upsamples: its point, the channels, the integer scale, the channels of
    the guide available there (0: none) and the resize smp does there (``interpolate`` options)."""

    point: str
    channels: int
    scale: int
    guide_channels: int
    smp_resize: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PointInfo:
    """What ``upzoo list`` says about a point: what it upsamples and where its guide comes from."""

    point: str
    what: str
    guide: str  # "" where there is none: a guided block cannot go there


def point_groups(places: Sequence[Place]) -> list[str]:
    """The points of ``places`` in order of first appearance."""
    return list(dict.fromkeys(p.point for p in places))


def _names(upsampler: Any, points: list[str], owner: str) -> dict[str, str | None]:
    """Per point, the block the user named (None: left at smp's resize). One name goes to every
    point but ``head`` (the logits' resize, which the upsampler papers keep bilinear)."""
    if upsampler is None:
        return dict.fromkeys(points)
    if isinstance(upsampler, str):
        return {p: (None if p == "head" else upsampler) for p in points}
    if isinstance(upsampler, Mapping):
        for key in upsampler:
            if key not in points:
                raise ConfigError(
                    f"{owner} upsampler: no point {key!r}; its points are {', '.join(points)}"
                    f"{did_you_mean(str(key), points)}"
                )
        return {p: upsampler.get(p) for p in points}
    if isinstance(upsampler, Sequence) and len(upsampler) == len(points):
        return dict(zip(points, upsampler))
    raise ConfigError(
        f"{owner} upsampler: expected a block name, a list with one per point ({', '.join(points)}) or a mapping "
        f"point -> name, got {upsampler!r}"
    )


def _options(upsampler_options: Any, names: dict[str, str | None], owner: str) -> dict[str, dict[str, Any]]:
    """Per point, the user's options: one mapping for every point whose block the user named, or a
    mapping keyed by point (a point left at smp's resize then takes ``interpolate`` with them)."""
    points = list(names)
    if upsampler_options is None:
        return {p: {} for p in points}
    if not isinstance(upsampler_options, Mapping):
        raise ConfigError(f"{owner} upsampler_options: expected a mapping, got {upsampler_options!r}")
    keyed = [k for k in upsampler_options if k in points]
    if keyed and len(keyed) == len(upsampler_options):
        if not all(isinstance(v, Mapping) for v in upsampler_options.values()):
            raise ConfigError(f"{owner} upsampler_options by point: each value must be a mapping of options")
        return {p: block_options(upsampler_options.get(p), f"{owner} {p}") for p in points}
    if keyed:
        raise ConfigError(
            f"{owner} upsampler_options mixes point names ({', '.join(keyed)}) with block options; give either "
            f"one mapping for the named blocks or one mapping per point"
        )
    if upsampler_options and all(name is None for name in names.values()):
        raise ConfigError(
            f"{owner} upsampler_options {dict(upsampler_options)!r} apply to the blocks upsampler names, and it names "
            f"none; name them (upsampler=NAME) or key the options by point ({', '.join(points)})"
        )
    options = block_options(upsampler_options, owner)
    return {p: (dict(options) if names[p] is not None else {}) for p in points}


def build_point_blocks(
    places: Sequence[Place], upsampler: Any, upsampler_options: Any, owner: str
) -> dict[str, nn.ModuleList]:
    """One registered block per place, grouped by point.

    Raises:
        ConfigError: an unknown point, a guided block where no guide exists, a block whose output
            is not exactly input x scale. RegistryError: an unknown block or option.
    """
    points = point_groups(places)
    names = _names(upsampler, points, owner)
    options = _options(upsampler_options, names, owner)
    blocks: dict[str, nn.ModuleList] = {p: nn.ModuleList() for p in points}
    counts: dict[str, int] = {}
    for place in places:
        index = counts[place.point] = counts.get(place.point, -1) + 1
        where = f"{owner} {place.point} {index}"
        name, opts = names[place.point], options[place.point]
        name = "interpolate" if name is None else name  # "" is a name (refused), not "unset"
        if name == "interpolate" and not opts:
            opts = dict(place.smp_resize)
        blocks[place.point].append(
            stage_block(
                name,
                opts,
                where=where,
                in_channels=place.channels,
                out_channels=place.channels,
                scale=place.scale,
                guide_channels=place.guide_channels,
            )  # fmt: skip
        )
    return blocks
