"""Checkerboard artifacts in images: the periodic part of the high-pass residual, ``rms`` of its
per-phase means over its ``rms`` (0 for no periodic pattern, near 1 for a pure checkerboard)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from upzoo.checks import check_finite, check_positive_int
from upzoo.errors import ConfigError, ShapeError

__all__ = ["image_checkerboard", "phases"]


def phases(y: torch.Tensor, scale: Sequence[int], border: Sequence[int]) -> list[torch.Tensor]:
    """The phase sub-grids of ``y``, without ``border`` input pixels at each edge."""
    import itertools

    out = []
    for phase in itertools.product(*(range(s) for s in scale)):
        index = tuple(
            slice(p + b * s, y.shape[2 + a] - b * s, s) for a, (p, s, b) in enumerate(zip(phase, scale, border))
        )
        out.append(y[(slice(None), slice(None)) + index])
    return out


@torch.no_grad()
def image_checkerboard(images: torch.Tensor, period: int = 2) -> float:
    """Periodic share of the high-pass residual of ``(B, C, H, W)`` float images at ``period``
    (0: none), for images of at least ``period + 2`` pixels a side.

    Raises:
        ShapeError: not a 4D batch, or images too small for ``period``.
        ConfigError: not float images, NaN/inf values, or ``period`` not a whole number >= 2.
    """
    check_positive_int(period, "checkerboard period", minimum=2)
    if not isinstance(images, torch.Tensor) or not images.is_floating_point():
        shown = f"{images.dtype} tensor" if isinstance(images, torch.Tensor) else type(images).__name__
        raise ConfigError(f"checkerboard: expected float images (B, C, H, W), got a {shown}")
    if images.ndim != 4:
        raise ShapeError(f"checkerboard: expected float images (B, C, H, W), got shape {tuple(images.shape)}")
    if min(images.shape[0], images.shape[1]) < 1 or min(images.shape[2:]) < period + 2:
        raise ShapeError(
            f"checkerboard: images {tuple(images.shape)} too small: it needs B, C >= 1 and H, W >= "
            f"period + 2 = {period + 2}"
        )
    check_finite(images, "checkerboard images")
    x = images.double()
    c = x.shape[1]
    box = torch.ones(c, 1, 3, 3, dtype=x.dtype) / 9
    residual = x - F.conv2d(F.pad(x, [1, 1, 1, 1], mode="replicate"), box, groups=c)
    subs = phases(residual, (period, period), (1, 1))
    means = torch.stack([s.mean(dim=(0, 2, 3)) for s in subs])  # (phases, C)
    rms = residual[..., 1:-1, 1:-1].pow(2).mean().sqrt()
    return float(means.pow(2).mean().sqrt() / rms.clamp_min(1e-12))
