"""Per-axis encoder strides from voxel spacing, the way nnU-Net's planner chooses them."""

from __future__ import annotations

from collections.abc import Sequence

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
    spacing = [float(s) for s in spacing]
    sizes = [int(s) for s in patch_size]
    if len(spacing) != len(sizes) or not spacing:
        raise ConfigError(f"spacing {tuple(spacing)} and patch_size {tuple(sizes)} need one value per axis each")
    if any(s <= 0 for s in spacing) or any(s < 1 for s in sizes):
        raise ConfigError(f"spacing and patch_size must be positive, got {tuple(spacing)} and {tuple(sizes)}")
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
