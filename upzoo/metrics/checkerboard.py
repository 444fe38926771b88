"""Checkerboard artifacts in images: the periodic part of the high-pass residual, ``rms`` of its
per-phase means over its ``rms`` (0 for no periodic pattern, near 1 for a pure checkerboard)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

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
    """Periodic share of the high-pass residual of ``(B, C, H, W)`` images at ``period`` (0: none)."""
    x = images.double()
    c = x.shape[1]
    box = torch.ones(c, 1, 3, 3, dtype=x.dtype) / 9
    residual = x - F.conv2d(F.pad(x, [1, 1, 1, 1], mode="replicate"), box, groups=c)
    subs = phases(residual, (period, period), (1, 1))
    means = torch.stack([s.mean(dim=(0, 2, 3)) for s in subs])  # (phases, C)
    rms = residual[..., 1:-1, 1:-1].pow(2).mean().sqrt()
    return float(means.pow(2).mean().sqrt() / rms.clamp_min(1e-12))
