"""A tissue labelling that uses no label: the thick slices interpolated onto the thin grid (cubic), and
four intensity classes (background, CSF/other, grey matter, white matter, darkest first) from a
1D k-means fitted on the *training* blocks' voxels only, then applied to the held-out block. The
baseline a network trained on labels has to beat; the oracle (each slab's most frequent true label)
is the ceiling of labelling the thick grid."""

from __future__ import annotations

import numpy as np

from upzoo.data.slabs import interpolate_slices
from upzoo.data.through_plane import ThickSliceVolume
from upzoo.errors import DataError

__all__ = ["kmeans_thresholds", "kmeans_tissue_labels"]


def kmeans_thresholds(values: np.ndarray, classes: int = 4, iterations: int = 100) -> np.ndarray:
    """The ``classes - 1`` cuts between the sorted centres of Lloyd's 1D k-means on intensities ``values``:
    deterministic, the first centre at the minimum (the background) and the others at the 15th, 50th
    and 85th percentiles (spread evenly for another ``classes``) of the values above 5 % of the maximum.

    >>> kmeans_thresholds(np.array([0.0, 0.0, 0.4, 0.41, 0.65, 0.66, 0.85, 0.86])).round(3)
    array([0.202, 0.53 , 0.755])

    Raises:
        DataError: values that are not finite, or fewer distinct values than classes.
    """
    ordered = np.sort(np.asarray(values, dtype=np.float64).ravel())  # each class a run of it: prefix-sum means
    if not np.isfinite(ordered).all() or np.count_nonzero(np.diff(ordered)) + 1 < classes:
        raise DataError(f"kmeans_thresholds: {classes} classes need {classes} distinct finite values")
    foreground = ordered[ordered > 0.05 * ordered[-1]]  # intensities: the background near 0 (or below: overshoot)
    quantiles = np.linspace(0.15, 0.85, classes - 1) if classes > 2 else [0.5]
    centres = np.array([ordered[0], *np.quantile(foreground, quantiles)])
    sums = np.concatenate([[0.0], np.cumsum(ordered)])
    for _ in range(iterations):
        edges = np.concatenate([[0], np.searchsorted(ordered, (centres[1:] + centres[:-1]) / 2), [len(ordered)]])
        counts = np.diff(edges)
        moved = np.where(counts > 0, np.diff(sums[edges]) / np.maximum(counts, 1), centres)
        if np.allclose(moved, centres, rtol=0, atol=1e-9):
            break
        centres = np.sort(moved)
    return (centres[1:] + centres[:-1]) / 2


def kmeans_tissue_labels(volume: ThickSliceVolume, method: str = "cubic") -> np.ndarray:
    """The held-out block's labels ``(D, H_val, W)`` (uint8, the tissue classes' order) from the thick
    slices alone: :func:`kmeans_thresholds` of the ``method``-interpolated training blocks."""
    thin = interpolate_slices(volume.thick, volume.factor, method)
    training = np.concatenate([thin[:, block].ravel() for block in volume.train_blocks])
    cuts = kmeans_thresholds(training)
    return np.digitize(thin[:, volume.val_block], cuts).astype(np.uint8)
