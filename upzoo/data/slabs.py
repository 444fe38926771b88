"""The slab model of thick-slice acquisition, and the interpolations a learned through-plane
upsampler has to beat.

A scanner acquiring slices ``k`` voxels thick records, per slice, the mean over its slab (a box
slab profile; :func:`thick_slices`), optionally with noise; the thick slice's centre lies at the
mean of its thin slices' centres (:func:`thick_affine`). :func:`interpolate_slices` brings thick
slices back to the thin grid on that geometry (voxel centres as PyTorch's ``align_corners=False``):
linear, cubic convolution (Keys, a = -0.75, PyTorch's bicubic) or a cubic B-spline (SciPy's
``zoom``, order 3). Arrays are ``(D, H, W)``; the slices are along ``axis`` (0: axial).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from upzoo.errors import ConfigError, ShapeError

__all__ = ["SLICE_INTERPOLATIONS", "slab_factor", "thick_slices", "thick_affine", "thin_affine", "interpolate_slices"]

SLICE_INTERPOLATIONS = ("linear", "cubic", "bspline")


def _slices_first(volume: np.ndarray, axis: int, owner: str) -> np.ndarray:
    """``volume`` as float32 with the slice axis first.

    Raises:
        ShapeError: not a 3D array, or an axis that is not 0, 1 or 2.
    """
    volume = np.asarray(volume)
    if volume.ndim != 3:
        raise ShapeError(f"{owner}: expected a (D, H, W) volume, got shape {volume.shape}")
    if isinstance(axis, bool) or axis not in (0, 1, 2):
        raise ShapeError(f"{owner}: axis must be 0, 1 or 2 (the slice axis of a (D, H, W) volume), got {axis!r}")
    return np.moveaxis(volume.astype(np.float32, copy=False), axis, 0)


def slab_factor(thickness_mm: float, spacing_mm: float) -> int:
    """How many thin slices one thick slice averages.

    Raises:
        ConfigError: a thickness that is not a positive whole multiple of the voxel size.
    """
    if isinstance(thickness_mm, bool) or not isinstance(thickness_mm, (int, float)) or not thickness_mm > 0:
        raise ConfigError(f"slice thickness must be a positive size in mm, got {thickness_mm!r}")
    factor = thickness_mm / spacing_mm
    if not math.isclose(factor, round(factor), abs_tol=1e-6) or round(factor) < 1:
        raise ConfigError(
            f"slice thickness {thickness_mm} mm is not a whole multiple of the {spacing_mm} mm voxels; use e.g. "
            f"{max(1, round(factor)) * spacing_mm:g} mm"
        )
    return int(round(factor))


def thick_slices(
    volume: np.ndarray, factor: int, *, axis: int = 0, noise: float = 0.0, seed: int = 0
) -> np.ndarray:  # fmt: skip
    """Each run of ``factor`` slices along ``axis`` averaged into one (a box slab profile), plus
    Gaussian noise of standard deviation ``noise`` (``seed``): ``(D, H, W) -> (D / factor, H, W)`` on axis 0.

    Raises:
        ShapeError: not a 3D volume, another axis than 0-2, or an axis whose length ``factor`` does not
            divide (the length to crop to).
        ConfigError: a factor below 1 or negative noise.
    """
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ConfigError(f"thick_slices: factor must be a whole number of slices >= 1, got {factor!r}")
    if not (isinstance(noise, (int, float)) and math.isfinite(noise) and noise >= 0):
        raise ConfigError(f"thick_slices: noise must be a standard deviation >= 0, got {noise!r}")
    moved = _slices_first(volume, axis, "thick_slices")
    length = moved.shape[0]
    if length % factor:
        raise ShapeError(
            f"thick_slices: {length} slices on axis {axis} do not divide into slabs of {factor}; crop to "
            f"{length - length % factor} slices (or pad to {length + factor - length % factor})"
        )
    thick = moved.reshape(length // factor, factor, *moved.shape[1:]).mean(1)
    if noise:
        thick = thick + np.random.default_rng(seed).normal(0, noise, thick.shape).astype(np.float32)
    return np.ascontiguousarray(np.moveaxis(thick, 0, axis))


def thick_affine(affine: np.ndarray, factor: int, *, axis: int = 0) -> np.ndarray:
    """The affine of :func:`thick_slices`' grid: voxels ``factor`` times longer along ``axis``, the
    first one centred at the mean of the thin slices it averages.

    Raises:
        ConfigError: an affine that is not 4x4 and axis-aligned (the slab model needs slices along a voxel
            axis), a factor that is not a whole number >= 1.
    """
    _check_factor(factor, "thick_affine")
    affine = np.asarray(affine, dtype=np.float64)
    if affine.shape != (4, 4) or np.count_nonzero(np.abs(affine[:3, :3]) > 1e-6 * np.abs(affine[:3, :3]).max()) != 3:
        raise ConfigError(
            "thick_affine: the slab model needs an axis-aligned 4x4 affine (one nonzero per column); "
            "resample the volume to an axis-aligned grid first"
        )
    out = affine.copy()
    out[:3, 3] = affine[:3, 3] + affine[:3, axis] * (factor - 1) / 2
    out[:3, axis] = affine[:3, axis] * factor
    return out


def _check_factor(factor: object, owner: str) -> None:
    if isinstance(factor, bool) or not isinstance(factor, (int, np.integer)) or factor < 1:
        raise ConfigError(f"{owner}: factor must be a whole number of thin slices per slab >= 1, got {factor!r}")


def thin_affine(affine: np.ndarray, factor: int, *, axis: int = 0) -> np.ndarray:
    """The affine of the thin grid that :func:`thick_affine` made ``affine`` from (its inverse):
    voxels ``factor`` times shorter along ``axis``, the first thin slice at the bottom of the first slab.

    Raises:
        ConfigError: as :func:`thick_affine`.
    """
    _check_factor(factor, "thin_affine")
    thick_affine(affine, 1, axis=axis)  # the same checks of the affine
    affine = np.asarray(affine, dtype=np.float64)
    out = affine.copy()
    out[:3, axis] = affine[:3, axis] / factor
    out[:3, 3] = affine[:3, 3] - out[:3, axis] * (factor - 1) / 2
    return out


def interpolate_slices(thick: np.ndarray, factor: int, method: str = "linear", *, axis: int = 0) -> np.ndarray:
    """Thick slices back on the thin grid (``factor`` times as many along ``axis``), each thin
    voxel interpolated at its centre; edges extended by their nearest slice.

    Raises:
        ConfigError: an unknown method or a factor below 1. ShapeError: as :func:`thick_slices`.
    """
    if method not in SLICE_INTERPOLATIONS:
        raise ConfigError(
            f"interpolate_slices: method must be one of {', '.join(SLICE_INTERPOLATIONS)}, got {method!r}"
        )
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ConfigError(f"interpolate_slices: factor must be a whole number >= 1, got {factor!r}")
    moved = _slices_first(thick, axis, "interpolate_slices")
    if method == "bspline":
        from upzoo.data.resampling import resample_image

        thin = resample_image(moved, (moved.shape[0] * factor, *moved.shape[1:]), order=3)
    else:
        planes = torch.from_numpy(np.ascontiguousarray(moved)).reshape(1, 1, moved.shape[0], -1)
        mode = "bilinear" if method == "linear" else "bicubic"  # the second axis keeps its grid: weights (0, 1, 0)
        thin = F.interpolate(planes, size=(moved.shape[0] * factor, planes.shape[-1]), mode=mode, align_corners=False)
        thin = thin.reshape(moved.shape[0] * factor, *moved.shape[1:]).numpy()
    return np.ascontiguousarray(np.moveaxis(thin, 0, axis))
