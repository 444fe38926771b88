"""Surface metrics of 3D (or 2D) label maps with the voxel spacing: the 95th-percentile Hausdorff
distance (HD95) and the normalised surface Dice (Nikolov et al., 2021) at a tolerance in mm.

Per class, a mask's surface is its voxels that have a face-neighbour outside the mask (the mask
minus its erosion by the 6-connected cross; outside the volume counts as outside), as in MONAI.
Distances are Euclidean in millimetres (``spacing`` per axis). HD95 is the larger of the two
directed 95th percentiles (prediction -> reference surface and back; linear interpolation, like
``torch.quantile``); the surface Dice is the share of both surfaces within ``tolerance_mm`` of the
other. A class absent from both is ``NaN`` (left out of means, as for mIoU); present in only one,
HD95 is ``inf`` and the surface Dice 0.

Both come from one computation per class (:func:`surface_metrics` returns both): the masks are
cropped to their joint bounding box (exact: every surface voxel lies inside it), and the distances
come from a k-d tree of surface points where the surfaces are sparse in that box, else from a
Euclidean distance transform.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from upzoo.checks import check_spacing
from upzoo.errors import ConfigError, ShapeError
from upzoo.metrics.confusion import check_num_classes
from upzoo.metrics.results import SurfaceScores
from upzoo.metrics.streaming import StreamingMetric

__all__ = ["surface_distances", "surface_metrics", "hausdorff95", "surface_dice", "SurfaceMetrics"]


#: surfaces with fewer points than the box's voxels / SPARSE_FACTOR take the k-d tree path, others the
#: distance transform; both give the same numbers, ties included (tests force each path).
SPARSE_FACTOR = 8


def _surface(mask: np.ndarray) -> np.ndarray:
    """``mask`` minus its erosion by the face-connected cross (outside the array counts as outside)."""
    padded = np.pad(mask, 1)
    inner = mask.copy()
    for axis in range(mask.ndim):
        for start in (0, 2):
            index = [slice(1, -1)] * mask.ndim
            index[axis] = slice(start, start + mask.shape[axis])
            inner &= padded[tuple(index)]
    return mask & ~inner


def _distances(from_surface: np.ndarray, to_surface: np.ndarray, spacing: Sequence[float]) -> np.ndarray:
    """Distance (mm) of each voxel of ``from_surface`` to the nearest voxel of ``to_surface``: a k-d
    tree of the surface points when the surfaces are sparse in the box, else one Euclidean
    distance transform of the box (the same numbers)."""
    from scipy.ndimage import distance_transform_edt
    from scipy.spatial import cKDTree

    points = int(from_surface.sum()) + int(to_surface.sum())
    if points * SPARSE_FACTOR < from_surface.size:
        scale = np.asarray(spacing, dtype=np.float64)
        sources, targets = np.argwhere(from_surface), np.argwhere(to_surface)
        nearest = cKDTree(targets * scale).query(sources * scale, workers=-1)[1]
        # the distance from the integer offsets, as the distance transform computes it: (3 - 1) * 0.8
        # is exactly 1.6, where 3 * 0.8 - 1 * 0.8 is 1.6000000000000005 and fails a 1.6 mm tolerance
        offsets = (sources - targets[nearest]) * scale
        return np.sqrt((offsets * offsets).sum(axis=1))
    return distance_transform_edt(~to_surface, sampling=spacing)[from_surface]


def surface_distances(
    pred: np.ndarray, target: np.ndarray, spacing: Sequence[float]
) -> tuple[np.ndarray, np.ndarray] | None:
    """Distances (mm) from each prediction surface voxel to the reference surface, and back, of two
    bool masks; ``None`` if both are empty (an empty side gives ``inf`` distances)."""
    either = pred | target
    if not either.any():
        return None
    box = tuple(slice(int(i.min()), int(i.max()) + 1) for i in np.nonzero(either))
    sp, st = _surface(pred[box]), _surface(target[box])
    if not sp.any() or not st.any():
        return np.full(int(sp.sum()), np.inf), np.full(int(st.sum()), np.inf)
    return _distances(sp, st, spacing), _distances(st, sp, spacing)


def _hd95(distances: tuple[np.ndarray, np.ndarray]) -> float:
    if any(np.isinf(d).any() for d in distances):  # a class in only one of the two
        return float("inf")
    return max(float(np.quantile(d, 0.95)) if d.size else 0.0 for d in distances)


#: relative margin under which a distance counts as equal to the tolerance: distances are sums of
#: integer multiples of the spacing, and 3 * 0.8 is 2.4000000000000004 in float64 — equal to a
#: 2.4 mm tolerance, as MONAI (which compares in float32) counts it
TIE_MARGIN = 1e-9


def _nsd(distances: tuple[np.ndarray, np.ndarray], tolerance_mm: float) -> float:
    total = sum(d.size for d in distances)
    limit = tolerance_mm * (1 + TIE_MARGIN)
    return float(sum((d <= limit).sum() for d in distances) / total) if total else float("nan")


def _per_class(pred, target, num_classes: int, spacing, fn, empty=float("nan")) -> torch.Tensor:
    """``fn`` of each class's distances: ``(K, ...)`` for one map, ``(N, K, ...)`` for a batch."""
    num_classes = check_num_classes(num_classes)
    _check_spacing(spacing)
    batched = _is_batch(pred, spacing)
    pred, target, spacings = _as_numpy(pred, target, spacing, num_classes)
    per_volume = []
    for p, t, sp in zip(pred, target, spacings):
        values = []
        for c in range(num_classes):
            distances = surface_distances(p == c, t == c, sp)
            values.append(empty if distances is None else fn(distances))
        per_volume.append(values)
    result = torch.tensor(per_volume, dtype=torch.float64)
    return result if batched else result[0]


def _is_batch(pred: Any, spacing: Any) -> bool:
    return len(getattr(pred, "shape", np.shape(pred))) == _axes(spacing) + 1


def _axes(spacing: Any) -> int:
    first = next(iter(spacing), None)
    return len(first) if isinstance(first, (list, tuple, np.ndarray)) else len(spacing)


def _check_spacing(spacing: Any) -> None:
    """A spacing per axis, or one per map: positive finite numbers in mm (:func:`~upzoo.checks.check_spacing`).

    Raises:
        ConfigError: a spacing of another kind, naming what came.
    """
    spacing = spacing.tolist() if isinstance(spacing, (torch.Tensor, np.ndarray)) else spacing
    sequence = (list, tuple)
    rows = spacing if isinstance(spacing, sequence) and len(spacing) and isinstance(spacing[0], sequence) else [spacing]
    for row in rows:
        check_spacing(row, "spacing (one per axis, or one per map)", axes=None)


def _check_labels(pred: np.ndarray, target: np.ndarray, num_classes: int) -> None:
    """Integer class indices in ``0..num_classes - 1`` (a label the metrics would never look at, or a
    fraction, would silently count as background).

    Raises:
        ConfigError: naming the map, its dtype or the range of its values.
    """
    for name, labels in (("prediction", pred), ("target", target)):
        if labels.dtype == bool or not np.issubdtype(labels.dtype, np.integer):
            raise ConfigError(f"surface metrics: {name} must hold integer class indices, got {labels.dtype}")
        if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
            raise ConfigError(
                f"surface metrics: {name} labels must be in 0..{num_classes - 1} (num_classes={num_classes}), "
                f"got values in {int(labels.min())}..{int(labels.max())}"
            )


def _check_tolerance(tolerance_mm: Any) -> float:
    """The surface Dice's tolerance: a finite number of mm, >= 0."""
    if (
        isinstance(tolerance_mm, bool)
        or not isinstance(tolerance_mm, (int, float, np.integer, np.floating))
        or not (0 <= float(tolerance_mm) < float("inf"))
    ):
        raise ConfigError(f"tolerance_mm must be a finite number of mm >= 0, got {tolerance_mm!r}")
    return float(tolerance_mm)


def _as_numpy(pred, target, spacing, num_classes: int) -> tuple[np.ndarray, np.ndarray, list]:
    """Label maps as ``(N, *S)`` arrays (one map becomes a batch of one) and one spacing per map:
    ``spacing`` is one spacing for all, or one per map of a batch (as MONAI takes them).

    Raises:
        ShapeError: shapes that differ, or a spacing that does not fit them.
    """
    pred = pred.detach().cpu().numpy() if isinstance(pred, torch.Tensor) else np.asarray(pred)
    target = target.detach().cpu().numpy() if isinstance(target, torch.Tensor) else np.asarray(target)
    per_map = isinstance(next(iter(spacing), None), (list, tuple, np.ndarray))
    axes = _axes(spacing)
    if pred.shape != target.shape or pred.ndim not in (axes, axes + 1) or (per_map and pred.ndim != axes + 1):
        raise ShapeError(
            f"surface metrics take two label maps (*S) or batches (N, *S) of one shape with one spacing per "
            f"axis (or one per map), got prediction {pred.shape}, target {target.shape} and spacing {tuple(spacing)}"
        )
    _check_labels(pred, target, num_classes)
    if pred.ndim == axes:
        pred, target = pred[None], target[None]
    spacings = (
        [tuple(float(v) for v in s) for s in spacing] if per_map else [tuple(float(v) for v in spacing)] * len(pred)
    )
    if len(spacings) != len(pred):
        raise ShapeError(f"{len(spacings)} spacings for a batch of {len(pred)} label maps; give one per map")
    return pred, target, spacings


def surface_metrics(pred, target, num_classes: int, *, spacing: Sequence[float], tolerance_mm: float) -> SurfaceScores:
    """Per-class HD95 and surface Dice from one pass (see :func:`hausdorff95`, :func:`surface_dice`)."""
    _check_tolerance(tolerance_mm)
    nan = float("nan")
    both = _per_class(pred, target, num_classes, spacing, lambda d: (_hd95(d), _nsd(d, tolerance_mm)), (nan, nan))
    return SurfaceScores(both[..., 0], both[..., 1])


def hausdorff95(pred, target, num_classes: int, *, spacing: Sequence[float]) -> torch.Tensor:
    """Per-class HD95 in mm (float64) of label maps ``(D, H, W)`` -> ``(K,)``, or of batches
    ``(N, D, H, W)`` -> ``(N, K)`` as MONAI returns them (``NaN``: class in neither; ``inf``: in one).
    ``spacing``: one spacing, or one per map of a batch."""
    return _per_class(pred, target, num_classes, spacing, _hd95)


def surface_dice(pred, target, num_classes: int, *, spacing: Sequence[float], tolerance_mm: float) -> torch.Tensor:
    """Per-class normalised surface Dice (float64) at ``tolerance_mm``, a distance equal to the tolerance
    counting as within it (as MONAI): ``(K,)`` for a map, ``(N, K)`` for a batch (``NaN``: class in
    neither)."""
    _check_tolerance(tolerance_mm)
    return _per_class(pred, target, num_classes, spacing, lambda d: _nsd(d, tolerance_mm))


class SurfaceMetrics(StreamingMetric):
    """Streaming HD95 and surface Dice over cases: ``update(pred, target, spacing)`` per case,
    per-class sums and counts of the case values (summable across DDP ranks), ``compute`` means.
    A case where a class is in only one of prediction and reference adds ``inf`` to that class's
    HD95 mean, as it should: the mean of a set with a missed structure is unbounded.

    ``sync_on_compute`` (default True): :meth:`compute` combines the DDP ranks first; False for a
    metric that one rank alone computes (see :class:`~upzoo.metrics.StreamingMetric`)."""

    def __init__(self, num_classes: int, *, tolerance_mm: float = 2.0, sync_on_compute: bool = True) -> None:
        super().__init__(sync_on_compute=sync_on_compute)
        self.num_classes, self.tolerance_mm = check_num_classes(num_classes), _check_tolerance(tolerance_mm)
        self.add_state("sums", torch.zeros(2, self.num_classes, dtype=torch.float64), "sum")  # HD95, surface Dice
        self.add_state("counts", torch.zeros(self.num_classes, dtype=torch.float64), "sum")

    def update(self, pred, target, spacing: Sequence[float]) -> None:
        """Add one case ``(*S)`` or a batch ``(N, *S)`` (``spacing``: one, or one per case)."""
        _check_spacing(spacing)
        preds, targets, spacings = _as_numpy(pred, target, spacing, self.num_classes)
        for p, t, sp in zip(preds, targets, spacings):
            for c in range(self.num_classes):
                distances = surface_distances(p == c, t == c, sp)
                if distances is not None:
                    self.sums[0, c] += _hd95(distances)
                    self.sums[1, c] += _nsd(distances, self.tolerance_mm)
                    self.counts[c] += 1

    def compute(self) -> dict[str, Any]:
        """``hd95`` and ``surface_dice`` (means over the foreground classes present, class 0 being the
        background) and their per-class lists."""
        means = torch.where(self.counts > 0, self.sums / self.counts.clamp_min(1), float("nan"))
        result: dict[str, Any] = {}
        for key, row in zip(("hd95", "surface_dice"), means):
            present = row[1:][~row[1:].isnan()]
            result[key] = float(present.mean()) if present.numel() else float("nan")
            result[f"per_class_{key}"] = row.tolist()
        return result
