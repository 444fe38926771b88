"""The boundary F-measure as the DAVIS benchmark defines it (Perazzi et al., CVPR 2016; the
``f_measure`` of davis2017-evaluation), for numbers comparable with papers that report DAVIS's F.

It differs from :func:`~upzoo.metrics.boundary_fscore`, upzoo's own boundary F-score, in three ways:

* **Boundary:** DAVIS marks a pixel when it differs from its right, lower or lower-right neighbour
  (a one-sided, 1-pixel boundary offset half a pixel towards the origin, Martin's ``seg2bmap``);
  upzoo marks the pixels of both sides of a label change (4-neighbourhood contours).
* **Tolerance:** DAVIS dilates by a disk of radius ``ceil(bound_th * image diagonal)`` pixels
  (``bound_th=0.008``), or ``bound_th`` pixels when it is >= 1; upzoo uses a fixed Euclidean radius.
* **Aggregation:** DAVIS computes F per frame and averages the frames, with F = 1 when both masks
  are empty and 0 when only one is; upzoo sums precision and recall counts over the dataset.

Here each class of a label map is a DAVIS object: its mask in the prediction against its mask in the
reference, ``ignore_index`` pixels void (left out of both masks, as DAVIS's ``void_pixels``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from upzoo.metrics.confusion import check_num_classes, label_maps
from upzoo.metrics.results import FrameScores

__all__ = ["davis_fmeasure", "davis_boundary_map"]


def davis_boundary_map(mask: np.ndarray) -> np.ndarray:
    """DAVIS's one-sided boundary of a bool mask ``(H, W)``: a pixel that differs from its right,
    lower or lower-right neighbour (the last row and column compare along their own axis only)."""
    seg = mask.astype(bool)
    right, down, diagonal = np.zeros_like(seg), np.zeros_like(seg), np.zeros_like(seg)
    right[:, :-1], down[:-1, :], diagonal[:-1, :-1] = seg[:, 1:], seg[1:, :], seg[1:, 1:]
    boundary = (seg ^ right) | (seg ^ down) | (seg ^ diagonal)
    boundary[-1, :] = seg[-1, :] ^ right[-1, :]
    boundary[:, -1] = seg[:, -1] ^ down[:, -1]
    boundary[-1, -1] = False
    return boundary


def _f(pred: np.ndarray, target: np.ndarray, radius: float) -> float:
    from scipy.ndimage import binary_dilation

    grid = np.arange(-radius, radius + 1)
    disk = grid[:, None] ** 2 + grid[None, :] ** 2 <= radius**2
    fg, gt = davis_boundary_map(pred), davis_boundary_map(target)
    n_fg, n_gt = int(fg.sum()), int(gt.sum())
    if n_fg == 0 or n_gt == 0:  # DAVIS: both empty 1, one empty 0
        return 1.0 if n_fg == n_gt else 0.0
    precision = float((fg & binary_dilation(gt, disk)).sum()) / n_fg
    recall = float((gt & binary_dilation(fg, disk)).sum()) / n_gt
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def davis_fmeasure(
    pred, target, num_classes: int, *, bound_th: float = 0.008, ignore_index: int | None = 255
) -> FrameScores:
    """``(per-class F averaged over the frames (K,), per-frame F (N, K))``, float64, of label maps
    ``(H, W)`` or ``(N, H, W)`` by DAVIS's definition (see the module).

    Raises:
        ShapeError: maps of different shapes or not 2D (batches of 2D); ConfigError: a bad class count.
    """
    num_classes = check_num_classes(num_classes, ignore_index)
    preds, targets = label_maps(pred, target, num_classes, ignore_index, "davis_fmeasure")
    radius = bound_th if bound_th >= 1 else math.ceil(bound_th * math.hypot(*preds.shape[1:]))
    frames = np.zeros((len(preds), num_classes))
    for n, (p, t) in enumerate(zip(preds, targets)):
        valid = t != ignore_index if ignore_index is not None else np.ones(t.shape, bool)
        for c in range(num_classes):
            frames[n, c] = _f((p == c) & valid, (t == c) & valid, float(radius))
    per_frame = torch.from_numpy(frames)
    return FrameScores(per_frame.mean(dim=0), per_frame)
