"""Per-axis encoder strides from voxel spacing, the way nnU-Net's planner chooses them."""

from __future__ import annotations

from collections.abc import Sequence

from upzoo.checks import check_positive_int, check_sizes, check_spacing
from upzoo.errors import ConfigError

__all__ = ["plan_strides"]


def plan_strides(
    spacing: Sequence[float], patch_size: Sequence[int], *, max_stages: int = 5, min_size: int = 8
) -> list[tuple[int, ...]]:
    """Per-stage, per-axis strides for an encoder, derived from voxel spacing and patch size.

    At each stage an axis is halved only while its current spacing is within 2x of the finest
    current spacing and its size stays ``>= min_size`` after halving; planning stops when no axis
    can be halved or after ``max_stages`` stages. Anisotropic volumes therefore get in-plane-only
    stages first, and the decoder's upsamplers mirror them.

    >>> plan_strides((5.0, 0.8, 0.8), (32, 128, 128))
    [(1, 2, 2), (1, 2, 2), (2, 2, 2), (2, 2, 2)]

    Raises:
        ConfigError: spacing and patch size of different lengths, or non-positive values.
    """
    spacing, sizes = _check_plan_arguments(spacing, patch_size, max_stages, min_size)
    strides: list[tuple[int, ...]] = []
    while len(strides) < max_stages:
        finest = min(spacing)
        stride = tuple(2 if sp <= 2 * finest and n // 2 >= min_size else 1 for sp, n in zip(spacing, sizes))
        if all(s == 1 for s in stride):
            break
        spacing = [sp * s for sp, s in zip(spacing, stride)]
        sizes = [n // s for n, s in zip(sizes, stride)]
        strides.append(stride)
    return strides


def _check_plan_arguments(
    spacing: Sequence[float], patch_size: Sequence[int], max_stages: int, min_size: int
) -> tuple[list[float], list[int]]:
    """``plan_strides``' arguments checked once, with the value named."""
    spacing = check_spacing(spacing, "spacing", axes=None)
    patch_size = check_sizes(patch_size, "patch_size")
    if len(spacing) != len(patch_size):
        raise ConfigError(f"spacing {tuple(spacing)} and patch_size {tuple(patch_size)} need one value per axis each")
    for name, value in (("max_stages", max_stages), ("min_size", min_size)):
        check_positive_int(value, name)
    return [float(s) for s in spacing], [int(n) for n in patch_size]
