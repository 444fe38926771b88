"""Boundary IoU (Cheng et al., CVPR 2021, "Boundary IoU: Improving Object-Centric Image Segmentation
Evaluation") for semantic segmentation, streaming like the confusion matrix.

Per class ``c``, the boundary region of a mask is its pixels within chessboard distance ``d`` of the
mask's contour (the image border counts as contour), as in the paper's reference code (the mask
minus its erosion by ``d`` iterations of a 3x3 square). Boundary IoU of class ``c`` is
``|G_d ∩ P_d| / |G_d ∪ P_d|`` with ``G_d``, ``P_d`` the boundary regions of ground truth and
prediction, summed over the dataset; ``d = max(1, round(dilation_ratio * image diagonal))``. A class
absent from both has ``NaN`` and is left out of the mean, as for mIoU. Pixels labelled
``ignore_index`` are not counted (they still bound the regions around them).

All classes are done at once: a pixel is inside its own region's band iff the nearest pixel of
another label (or the image border) is at most ``d`` away, i.e. iff its distance to the set of
pixels that have a differently-labelled 8-neighbour is below ``d`` — one OpenCV chessboard distance
transform per label map, not one erosion per class.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from upzoo.checks import check_number
from upzoo.metrics.confusion import check_num_classes, label_maps
from upzoo.metrics.results import ClassScores
from upzoo.metrics.streaming import StreamingMetric

__all__ = ["boundary_bands", "boundary_iou", "BoundaryIoU", "boundary_fscore", "BoundaryFScore"]


def _edges(labels: np.ndarray) -> np.ndarray:
    """Pixels with a differently-labelled 8-neighbour, the image border included."""
    padded = np.pad(labels.astype(np.int32), 1, constant_values=-1)
    h, w = labels.shape
    centre = padded[1:-1, 1:-1]
    edge = np.zeros((h, w), dtype=bool)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            if dy or dx:
                edge |= padded[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w] != centre
    return edge


def boundary_bands(labels: np.ndarray, dilation: int) -> np.ndarray:
    """``(H, W)`` bool: the pixels within chessboard distance ``dilation`` of their region's contour."""
    import cv2

    edge = _edges(labels)
    if dilation <= 1:
        return edge
    distance = cv2.distanceTransform((~edge).astype(np.uint8), cv2.DIST_C, 3)  # 0 on edge pixels
    return distance <= dilation - 1


def _dilation(shape: tuple[int, int], ratio: float) -> int:
    return max(1, int(round(ratio * math.hypot(*shape))))


def _counts(pred: np.ndarray, target: np.ndarray, num_classes: int, ignore_index: int | None, ratio: float):
    d = _dilation(pred.shape, ratio)
    valid = target != ignore_index if ignore_index is not None else np.ones(target.shape, bool)
    band_t, band_p = boundary_bands(target, d) & valid, boundary_bands(pred, d) & valid
    both = band_t & band_p & (pred == target)
    inter = np.bincount(target[both].ravel(), minlength=num_classes)[:num_classes]
    area_t = np.bincount(target[band_t].ravel(), minlength=num_classes)[:num_classes]
    area_p = np.bincount(pred[band_p].ravel(), minlength=num_classes)[:num_classes]
    return inter, area_t + area_p - inter


class BoundaryIoU(StreamingMetric):
    """Streaming Boundary IoU: ``update(pred, target)`` with ``(H, W)`` or ``(B, H, W)`` label maps,
    ``sync`` across DDP ranks (sums of integer counts), ``compute`` at the end.

    >>> acc = BoundaryIoU(num_classes=2)
    >>> square = torch.zeros(1, 12, 12, dtype=torch.long)
    >>> square[:, 3:9, 3:9] = 1
    >>> acc.update(square, square)
    >>> acc.compute()["boundary_iou"]
    1.0

    ``sync_on_compute`` (default True): :meth:`compute` combines the DDP ranks first; False for a
    metric that one rank alone computes (see :class:`~upzoo.metrics.StreamingMetric`).
    """

    def __init__(
        self,
        num_classes: int,
        ignore_index: int | None = 255,
        *,
        dilation_ratio: float = 0.02,
        sync_on_compute: bool = True,
    ) -> None:
        num_classes = check_num_classes(num_classes, ignore_index)
        dilation_ratio = check_number(dilation_ratio, "dilation_ratio", above=0, below=1)
        super().__init__(sync_on_compute=sync_on_compute)
        self.num_classes, self.ignore_index, self.dilation_ratio = num_classes, ignore_index, dilation_ratio
        self.add_state("intersection", torch.zeros(num_classes, dtype=torch.int64), "sum")
        self.add_state("union", torch.zeros(num_classes, dtype=torch.int64), "sum")

    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        """Add label maps ``(H, W)`` or ``(B, H, W)`` of the prediction and the reference.

        Raises:
            ShapeError: maps of different shapes, or not ``(H, W)``/``(B, H, W)``.
            ConfigError: labels that are not class indices of this metric.
        """
        preds, targets = label_maps(pred, target, self.num_classes, self.ignore_index, "Boundary IoU")
        for p, t in zip(preds, targets):
            inter, union = _counts(p, t, self.num_classes, self.ignore_index, self.dilation_ratio)
            self.intersection += torch.from_numpy(inter.astype(np.int64))
            self.union += torch.from_numpy(union.astype(np.int64))

    def compute(self) -> dict[str, Any]:
        """``boundary_iou`` (mean over classes present in either) and ``per_class_boundary_iou``."""
        union = self.union.double()
        per_class = torch.where(union > 0, self.intersection.double() / union.clamp_min(1), float("nan"))
        present = per_class[~per_class.isnan()]
        return {
            "boundary_iou": float(present.mean()) if present.numel() else float("nan"),
            "per_class_boundary_iou": per_class.tolist(),
        }


def boundary_iou(
    pred: torch.Tensor,
    target: torch.Tensor,
    num_classes: int,
    *,
    ignore_index: int | None = 255,
    dilation_ratio: float = 0.02,
) -> ClassScores:
    """Mean Boundary IoU and the per-class values (``NaN`` for classes absent from both) of label
    maps ``(H, W)`` or ``(B, H, W)``."""
    acc = BoundaryIoU(num_classes, ignore_index, dilation_ratio=dilation_ratio, sync_on_compute=False)
    acc.update(pred, target)
    result = acc.compute()
    return ClassScores(result["boundary_iou"], torch.tensor(result["per_class_boundary_iou"], dtype=torch.float64))


# -- boundary F-score -------------------------------------------------------------------------------


def _contours(labels: np.ndarray) -> np.ndarray:
    """Pixels with a differently-labelled 8-neighbour inside the image (the image border is not a
    contour here: a region reaching it has no boundary there)."""
    padded = np.pad(labels.astype(np.int32), 1, mode="edge")
    h, w = labels.shape
    edge = np.zeros((h, w), dtype=bool)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            if dy or dx:
                edge |= padded[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w] != labels
    return edge


def _offsets(tolerance: float) -> list[tuple[int, int]]:
    r = int(math.floor(tolerance))
    return [(dy, dx) for dy in range(-r, r + 1) for dx in range(-r, r + 1) if dy * dy + dx * dx <= tolerance**2]


def _matched(labels_a: np.ndarray, edge_a: np.ndarray, labels_b: np.ndarray, edge_b: np.ndarray, tolerance: float):
    """Per pixel of ``edge_a``: whether a pixel of ``edge_b`` with the same label lies within
    Euclidean distance ``tolerance`` — all classes at once, one shifted comparison per offset of
    the tolerance disk (13 for 2 px)."""
    r = int(math.floor(tolerance))
    contour_b = np.pad(np.where(edge_b, labels_b.astype(np.int32), -1), r, constant_values=-1)
    a = np.where(edge_a, labels_a.astype(np.int32), -2)
    h, w = a.shape
    hit = np.zeros(a.shape, dtype=bool)
    for dy, dx in _offsets(tolerance):
        hit |= contour_b[r + dy : r + dy + h, r + dx : r + dx + w] == a
    return hit


def _fscore_counts(pred, target, num_classes: int, ignore_index: int | None, tolerance: float) -> np.ndarray:
    """Per class: (matched prediction contour, prediction contour, matched reference contour,
    reference contour) pixel counts, ignored pixels left out."""
    valid = target != ignore_index if ignore_index is not None else np.ones(target.shape, bool)
    edge_p, edge_t = _contours(pred) & valid, _contours(target) & valid
    hit_p = _matched(pred, edge_p, target, edge_t, tolerance)
    hit_t = _matched(target, edge_t, pred, edge_p, tolerance)

    def count(labels, where):
        values = labels[where].astype(np.int64)
        return np.bincount(values[(values >= 0) & (values < num_classes)], minlength=num_classes)[:num_classes]

    return np.stack([count(pred, hit_p), count(pred, edge_p), count(target, hit_t), count(target, edge_t)])


class BoundaryFScore(StreamingMetric):
    """Streaming boundary F-score per class: precision is the share of predicted contour pixels
    within ``tolerance`` pixels (Euclidean) of the reference contour of the same class, recall the
    share of reference contour pixels within ``tolerance`` of the predicted one; ``F = 2PR / (P + R)``
    from counts summed over the dataset (and DDP ranks). ``NaN`` for a class with no contour in
    either; 0 if it has contour in only one.

    >>> acc = BoundaryFScore(num_classes=2)
    >>> square = torch.zeros(1, 12, 12, dtype=torch.long)
    >>> square[:, 3:9, 3:9] = 1
    >>> acc.update(square, square)
    >>> acc.compute()["boundary_fscore"]
    1.0

    ``sync_on_compute`` (default True): :meth:`compute` combines the DDP ranks first; False for a
    metric that one rank alone computes (see :class:`~upzoo.metrics.StreamingMetric`).
    """

    def __init__(
        self, num_classes: int, ignore_index: int | None = 255, *, tolerance: float = 2.0, sync_on_compute: bool = True
    ) -> None:
        num_classes = check_num_classes(num_classes, ignore_index)
        tolerance = check_number(tolerance, "tolerance (pixels)", at_least=0)
        super().__init__(sync_on_compute=sync_on_compute)
        self.num_classes, self.ignore_index, self.tolerance = num_classes, ignore_index, tolerance
        self.add_state("counts", torch.zeros(4, num_classes, dtype=torch.int64), "sum")  # hit/all pred, target

    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        """Add label maps ``(H, W)`` or ``(B, H, W)`` of the prediction and the reference.

        Raises:
            ShapeError: maps of different shapes, or not ``(H, W)``/``(B, H, W)``.
            ConfigError: labels that are not class indices of this metric.
        """
        preds, targets = label_maps(pred, target, self.num_classes, self.ignore_index, "the boundary F-score")
        for p, t in zip(preds, targets):
            counts = _fscore_counts(p, t, self.num_classes, self.ignore_index, self.tolerance)
            self.counts += torch.from_numpy(counts)

    def compute(self) -> dict[str, Any]:
        """``boundary_fscore`` (mean over classes with a contour) and ``per_class_boundary_fscore``."""
        hit_p, n_p, hit_t, n_t = self.counts.double()
        precision, recall = hit_p / n_p.clamp_min(1), hit_t / n_t.clamp_min(1)
        f = torch.where(precision + recall > 0, 2 * precision * recall / (precision + recall).clamp_min(1e-12), 0.0)
        f = torch.where((n_p + n_t) > 0, f, float("nan"))
        present = f[~f.isnan()]
        return {
            "boundary_fscore": float(present.mean()) if present.numel() else float("nan"),
            "per_class_boundary_fscore": f.tolist(),
        }


def boundary_fscore(
    pred: torch.Tensor, target: torch.Tensor, num_classes: int, *, ignore_index: int | None = 255, tolerance=2.0
) -> ClassScores:
    """Mean boundary F-score and the per-class values (float64) of label maps ``(H, W)`` or
    ``(B, H, W)``: contours of both sides of every label change, a fixed Euclidean ``tolerance`` in
    pixels, counts summed over the dataset. For DAVIS's definition (one-sided boundary, a tolerance
    relative to the image diagonal, F per frame, empty masks F = 1) use :func:`~upzoo.metrics.davis_fmeasure`."""
    acc = BoundaryFScore(num_classes, ignore_index, tolerance=tolerance, sync_on_compute=False)
    acc.update(pred, target)
    result = acc.compute()
    return ClassScores(
        result["boundary_fscore"], torch.tensor(result["per_class_boundary_fscore"], dtype=torch.float64)
    )
