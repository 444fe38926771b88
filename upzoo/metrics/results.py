"""What the metric functions return when they return more than one number: named tuples, so a result
reads by name (``mean_iou(...).per_class``) and still unpacks as the plain tuple it used to be
(``miou, per_class = mean_iou(...)``).

One convention throughout: a scalar is a Python ``float``; per-class, per-frame and per-image values
are float64 tensors (``NaN`` where a class is absent); a radial spectrum and the spectral error per
ring are float64 NumPy arrays (what a plot or a CSV takes), as :class:`~upzoo.metrics.RadialSpectrum`
computes them. The streaming classes' ``compute()`` return dicts of plain numbers and lists (what
``summary.json`` holds).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = ["ClassScores", "FrameScores", "SurfaceScores", "ImageScores", "KernelDistance", "SpectralError"]


class ClassScores(NamedTuple):
    """A dataset-level score: its mean over the classes present, and each class's (float64, ``NaN``
    for a class absent from both sides)."""

    mean: float
    per_class: torch.Tensor


class FrameScores(NamedTuple):
    """DAVIS's F: per class averaged over the frames ``(K,)``, and per frame ``(N, K)``."""

    per_class: torch.Tensor
    per_frame: torch.Tensor


class SurfaceScores(NamedTuple):
    """HD95 (mm) and the normalised surface Dice per class, ``(K,)`` or ``(N, K)``."""

    hd95: torch.Tensor
    surface_dice: torch.Tensor


class ImageScores(NamedTuple):
    """PSNR (dB) and SSIM per image ``(B,)``."""

    psnr: torch.Tensor
    ssim: torch.Tensor


class KernelDistance(NamedTuple):
    """KID: the mean over the subsets, and their standard deviation (0 for one subset)."""

    mean: float
    std: float


class SpectralError(NamedTuple):
    """The relative spectral error per ring ``(R,)``, and the mean ``|e|`` over the upper band."""

    per_ring: np.ndarray
    mean: float
