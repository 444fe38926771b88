"""Checkerboard artifacts, measured.

* :func:`checkerboard_score` — for a block: feed a smooth zero-mean input, split the output into
  the ``prod(scale)`` phase sub-grids (output positions with the same offset modulo the scale) and
  report the coefficient of variation of their energies. Uneven kernel overlap gives some phases
  more taps than others and so more energy: a fresh transposed conv with kernel 3 / stride 2 scores
  about 0.5, kernel 2 / stride 2 a few hundredths, resize-conv and ICNR pixel shuffle ~0.
* :func:`~upzoo.metrics.checkerboard.image_checkerboard` — for images (e.g. GAN samples), in
  ``upzoo.metrics`` (the training loop reports it), re-exported here.
* :func:`overlap_pattern` — the theoretical tap counts per output phase of a transposed conv.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.layers import linear_mode
from upzoo.metrics.checkerboard import image_checkerboard
from upzoo.metrics.checkerboard import phases as _phases
from upzoo.upsamplers.transposed import overlap_counts

__all__ = [
    "smooth_field",
    "phase_energies",
    "checkerboard_score",
    "image_checkerboard",
    "overlap_pattern",
    "overlap_unevenness",
]


def smooth_field(shape: Sequence[int], *, seed: int = 0, cell: int = 8) -> torch.Tensor:
    """A zero-mean, low-frequency random input ``(B, C, *S)``: coarse uniform noise, linearly upsampled.

    Zero mean, so that the score reflects how the block treats the phases (tap counts, per-phase
    weights summed over many channels) rather than one random sum of weights per output channel."""
    b, c, *spatial = (int(s) for s in shape)
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(b, c, *[max(2, s // cell + 2) for s in spatial], generator=g) * 2 - 1
    mode = linear_mode(len(spatial))
    return F.interpolate(coarse, size=tuple(spatial), mode=mode, align_corners=True)


def phase_energies(y: torch.Tensor, scale: Sequence[int], border: int = 2) -> torch.Tensor:
    """Mean squared value of each phase sub-grid of an upsampled output (edges excluded)."""
    subs = _phases(y.double(), scale, [border if s > 1 else 0 for s in scale])
    return torch.stack([s.pow(2).mean() for s in subs])


@torch.no_grad()
def checkerboard_score(block: nn.Module, input_shape: Sequence[int], *, seed: int = 0) -> float:
    """Coefficient of variation of the output's phase energies on a smooth input (0: none).

    ``block`` needs a ``scale`` attribute (every registered upsampler has one).
    """
    scale = tuple(block.scale)
    if all(s == 1 for s in scale):
        return 0.0
    was_training = block.training
    block.eval()
    try:
        y = block(smooth_field(input_shape, seed=seed).to(next(iter(block.parameters()), torch.empty(0)).dtype))
    finally:
        block.train(was_training)
    energies = phase_energies(y, scale)
    return float(energies.std(unbiased=False) / energies.mean().clamp_min(1e-12))


def overlap_pattern(
    kernel_size: Sequence[int], stride: Sequence[int], dilation: Sequence[int] | None = None
) -> torch.Tensor:
    """Taps per output phase of a transposed conv: the outer product of the per-axis counts."""
    dilation = dilation or [1] * len(kernel_size)
    pattern = torch.ones(())
    for k, s, d in zip(kernel_size, stride, dilation):
        pattern = pattern[..., None] * torch.tensor(overlap_counts(k, s, d), dtype=torch.float64)
    return pattern


def overlap_unevenness(
    kernel_size: Sequence[int], stride: Sequence[int], dilation: Sequence[int] | None = None
) -> float:
    """Coefficient of variation of :func:`overlap_pattern` (0 for even overlap; 0.48 for k3/s2 in 2D)."""
    p = overlap_pattern(kernel_size, stride, dilation).flatten()
    return float(p.std(unbiased=False) / p.mean()) if p.mean() > 0 else math.nan
