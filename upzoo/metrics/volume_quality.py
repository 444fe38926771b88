"""PSNR and SSIM of 3D volumes inside a mask (a brain mask: the background, where any method is
exact, would inflate both). Volumes are ``(D, H, W)`` arrays with values on a scale of
``data_range`` (1 for intensities in [0, 1]).

SSIM is Wang et al.'s with a 3D Gaussian window (sigma 1.5, 11 voxels a side: scikit-image's
``structural_similarity(gaussian_weights=True, use_sample_covariance=False)`` in 3D), its map
computed where the whole window fits, and averaged over the mask's voxels there.
"""

from __future__ import annotations

import math

import numpy as np

from upzoo.errors import ConfigError, ShapeError

__all__ = ["masked_psnr", "masked_ssim"]

_SIGMA, _RADIUS = 1.5, 5  # scikit-image: truncate 3.5 -> radius int(3.5 * 1.5 + 0.5) = 5


def _checked(output: np.ndarray, target: np.ndarray, mask: np.ndarray | None, data_range: float) -> tuple:
    output, target = (np.asarray(v, dtype=np.float64) for v in (output, target))
    if output.ndim != 3 or output.shape != target.shape:
        raise ShapeError(f"volumes must be two (D, H, W) arrays of one shape, got {output.shape} and {target.shape}")
    mask = np.ones(output.shape, bool) if mask is None else np.asarray(mask)
    if mask.shape != output.shape or mask.dtype != bool:
        raise ShapeError(
            f"mask must be a boolean array of the volumes' shape {output.shape}, got {mask.dtype} {mask.shape}"
        )
    if not mask.any():
        raise ShapeError("mask selects no voxel; give the region to measure (e.g. the brain mask)")
    if not (np.isfinite(output).all() and np.isfinite(target).all()):
        raise ConfigError("volumes must be finite: NaN or inf voxels have no PSNR/SSIM; check the prediction")
    if not (isinstance(data_range, (int, float)) and not isinstance(data_range, bool) and data_range > 0):
        raise ConfigError(f"data_range must be the positive span of the intensities (1 for [0, 1]), got {data_range!r}")
    span = float(target.max() - target.min())
    if span > data_range * (1 + 1e-6):
        raise ConfigError(
            f"data_range is {data_range:g} but the target's intensities span {span:.6g}: give the intensities' "
            f"scale as data_range (e.g. data_range={math.ceil(span):d} for 0-{math.ceil(span):d} volumes), "
            f"or rescale them"
        )
    return output, target, mask


def masked_psnr(
    output: np.ndarray, target: np.ndarray, mask: np.ndarray | None = None, *, data_range: float = 1.0
) -> float:
    """``10 log10(data_range² / MSE)`` over the voxels of ``mask`` (all: ``None``); ``inf`` when equal.

    >>> v = np.zeros((4, 4, 4)); masked_psnr(v + 0.1, v)
    20.0

    Raises:
        ShapeError: volumes of other shapes, or an empty mask. ConfigError: NaN/inf voxels, a bad ``data_range``
            (also one smaller than the target's span: 0-255 volumes measured with ``data_range=1``).
    """
    output, target, mask = _checked(output, target, mask, data_range)
    mse = float(np.mean((output[mask] - target[mask]) ** 2))
    return math.inf if mse == 0 else round(10 * math.log10(data_range**2 / mse), 10)


def _gaussian(volume: np.ndarray) -> np.ndarray:
    """The valid part of a separable 3D Gaussian filter (sigma 1.5, 11 taps, normalised)."""
    from scipy.ndimage import correlate1d

    offsets = np.arange(-_RADIUS, _RADIUS + 1, dtype=np.float64)
    kernel = np.exp(-(offsets**2) / (2 * _SIGMA**2))
    kernel /= kernel.sum()
    for axis in range(3):
        volume = correlate1d(volume, kernel, axis=axis, mode="reflect")
    core = slice(_RADIUS, -_RADIUS)
    return volume[core, core, core]


def masked_ssim(
    output: np.ndarray, target: np.ndarray, mask: np.ndarray | None = None, *, data_range: float = 1.0
) -> float:
    """Mean 3D SSIM over the voxels of ``mask`` where the 11-voxel window fits (all of those: ``None``).

    Raises:
        ShapeError: as :func:`masked_psnr`, or volumes smaller than the window (11 a side), or a mask
            with no voxel where the window fits.
    """
    output, target, mask = _checked(output, target, mask, data_range)
    if min(output.shape) < 2 * _RADIUS + 1:
        raise ShapeError(f"masked_ssim: volumes must be at least {2 * _RADIUS + 1} voxels a side, got {output.shape}")
    core = mask[_RADIUS:-_RADIUS, _RADIUS:-_RADIUS, _RADIUS:-_RADIUS]
    if not core.any():
        raise ShapeError(f"masked_ssim: the mask has no voxel {_RADIUS} or more voxels inside the volume's border")
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mu_a, mu_b = _gaussian(output), _gaussian(target)
    var_a = _gaussian(output * output) - mu_a**2
    var_b = _gaussian(target * target) - mu_b**2
    cov = _gaussian(output * target) - mu_a * mu_b
    index = (2 * mu_a * mu_b + c1) * (2 * cov + c2) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return float(index[core].mean())
