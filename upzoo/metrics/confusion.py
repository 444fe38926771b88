"""Segmentation metrics from a dataset-level confusion matrix (one ``bincount`` per batch).

Conventions (as mmsegmentation and Cityscapes): pixels whose target is ``ignore_index`` are left
out; per-class IoU is ``TP / (TP + FP + FN)`` over the whole dataset, not averaged per image; a class
absent from both prediction and ground truth has IoU ``NaN`` and is left out of the mean; a class
predicted but absent from the ground truth has IoU 0 and counts.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from upzoo.errors import ConfigError, ShapeError
from upzoo.metrics.results import ClassScores
from upzoo.metrics.streaming import StreamingMetric

__all__ = [
    "confusion_matrix",
    "iou_from_confusion",
    "dice_from_confusion",
    "pixel_accuracy",
    "mean_iou",
    "ConfusionMatrix",
]


def check_num_classes(num_classes: Any, ignore_index: Any = None) -> int:
    """``num_classes`` (a whole number >= 1) and ``ignore_index`` (a whole number or None), checked.

    Raises:
        ConfigError: naming the value that came.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ConfigError(
            f"num_classes must be a whole number >= 1, got {num_classes!r} ({type(num_classes).__name__})"
        )
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer))):
        raise ConfigError(f"ignore_index must be a whole number or None, got {ignore_index!r}")
    return int(num_classes)


def as_labels(value: Any, name: str) -> torch.Tensor:
    """A label map as a tensor: tensors as they are, NumPy arrays and lists converted.

    Raises:
        ConfigError: anything else, naming ``name`` and the type that came.
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (np.ndarray, list, tuple)):
        try:
            return torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"{name} is not an array of class indices ({exc})") from None
    raise ConfigError(f"{name} must be a tensor or NumPy array of class indices, got {type(value).__name__}")


def _index_dtype(num_classes: int) -> torch.dtype:
    return torch.int16 if num_classes * num_classes < 2**15 else torch.int32 if num_classes < 46340 else torch.int64


def check_label_values(pred: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int | None) -> None:
    """Both label maps hold integer class indices in ``0..K-1`` (the target also ``ignore_index``).

    Raises:
        ConfigError: a floating-point or bool map, or labels out of range (with the range found).
    """
    for name, t in (("prediction", pred), ("target", target)):
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ConfigError(f"{name} must hold integer class indices, got {t.dtype}")
    if not pred.numel():
        return
    checked = target if ignore_index is None else target.masked_fill(target == ignore_index, 0)
    for name, t in (("prediction", pred), ("target", checked)):
        low, high = (int(v) for v in torch.aminmax(t))
        if low < 0 or high >= num_classes:
            extra = f" or {ignore_index}" if name == "target" and ignore_index is not None else ""
            raise ConfigError(f"{name} labels must be in 0..{num_classes - 1}{extra}, got values in {low}..{high}")


def confusion_matrix(
    pred: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int | None = 255, *, validate: bool = True
) -> torch.Tensor:
    """``(K, K)`` int64 counts, rows = ground truth, columns = prediction.

    Args:
        pred: integer label map (any number of dims).
        target: integer label map of the same shape.
        validate: check shapes and that labels lie in ``0..K-1`` (or are ``ignore_index``).

    Raises:
        ShapeError: shapes differ.
        ConfigError: labels out of range (with the offending values), or a bad class count.
    """
    if validate:
        num_classes = check_num_classes(num_classes, ignore_index)
        pred, target = as_labels(pred, "prediction"), as_labels(target, "target")
        if pred.shape != target.shape:
            raise ShapeError(
                f"prediction {tuple(pred.shape)} and target {tuple(target.shape)} differ in shape; "
                f"pass class indices (argmax over the class axis), not logits"
            )
    dtype = _index_dtype(num_classes)
    index = target.to(dtype) * num_classes + pred.to(dtype)  # bin K*K collects the ignored pixels
    ignored = target == ignore_index if ignore_index is not None else None
    if validate:
        check_label_values(pred, target, num_classes, ignore_index)
    if ignored is not None:
        index.masked_fill_(ignored, num_classes * num_classes)
    counts = torch.bincount(index.flatten(), minlength=num_classes * num_classes + 1)
    return counts[: num_classes * num_classes].view(num_classes, num_classes).to(torch.int64)


def iou_from_confusion(cm: torch.Tensor) -> torch.Tensor:
    """Per-class IoU (float64), NaN for classes absent from both prediction and ground truth."""
    cm = cm.to(torch.float64)
    tp = cm.diagonal()
    union = cm.sum(0) + cm.sum(1) - tp
    return torch.where(union > 0, tp / union.clamp_min(1), torch.full_like(tp, math.nan))


def dice_from_confusion(cm: torch.Tensor) -> torch.Tensor:
    """Per-class Dice ``2TP / (2TP + FP + FN)`` (float64), NaN where the class is absent from both."""
    cm = cm.to(torch.float64)
    tp = cm.diagonal()
    denom = cm.sum(0) + cm.sum(1)
    return torch.where(denom > 0, 2 * tp / denom.clamp_min(1), torch.full_like(tp, math.nan))


def pixel_accuracy(cm: torch.Tensor) -> float:
    """Correct pixels over all counted pixels (ignored ones excluded)."""
    total = int(cm.sum())
    return float(cm.diagonal().sum()) / total if total else math.nan


def _nanmean(values: torch.Tensor) -> float:
    valid = values[~torch.isnan(values)]
    return float(valid.mean()) if valid.numel() else math.nan


def mean_iou(pred: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int | None = 255) -> ClassScores:
    """``(mIoU, per-class IoU)`` over all pixels of ``pred``/``target`` (see the module's conventions).

    >>> miou, per_class = mean_iou(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 255]), num_classes=3)
    >>> miou, per_class.tolist()
    (1.0, [1.0, 1.0, nan])
    """
    iou = iou_from_confusion(confusion_matrix(pred, target, num_classes, ignore_index))
    return ClassScores(_nanmean(iou), iou)


def label_maps(pred, target, num_classes: int, ignore_index: int | None, owner: str) -> tuple[np.ndarray, np.ndarray]:
    """Prediction and reference label maps ``(H, W)`` or ``(B, H, W)`` of one shape, checked, as
    NumPy batches ``(B, H, W)``.

    Raises:
        ShapeError: maps of different shapes, or not 2D (batches of 2D).
        ConfigError: labels that are not class indices of ``num_classes`` (or ``ignore_index``).
    """
    pred, target = as_labels(pred, "prediction"), as_labels(target, "target")
    if pred.shape != target.shape or pred.ndim not in (2, 3):
        raise ShapeError(
            f"{owner} takes label maps (H, W) or (B, H, W) of one shape, got prediction {tuple(pred.shape)} and "
            f"target {tuple(target.shape)}"
        )
    check_label_values(pred, target, num_classes, ignore_index)
    preds, targets = pred.detach().cpu().numpy(), target.detach().cpu().numpy()
    return preds.reshape(-1, *preds.shape[-2:]), targets.reshape(-1, *targets.shape[-2:])


class ConfusionMatrix(StreamingMetric):
    """Streaming accumulator: ``update`` per batch, ``compute`` at the end, ``sync`` across DDP
    ranks (a sum of the integer counts, so every rank then computes the same numbers).

    >>> acc = ConfusionMatrix(num_classes=2)
    >>> acc.update(torch.tensor([0, 1]), torch.tensor([0, 0]))
    >>> acc.compute()["miou"]
    0.25

    ``sync_on_compute`` (default True): :meth:`compute` combines the DDP ranks first; False for a
    metric that one rank alone computes (see :class:`~upzoo.metrics.StreamingMetric`).
    """

    def __init__(
        self, num_classes: int, ignore_index: int | None = 255, *, validate: bool = True, sync_on_compute: bool = True
    ) -> None:
        num_classes = check_num_classes(num_classes, ignore_index)
        super().__init__(sync_on_compute=sync_on_compute)
        self.num_classes, self.ignore_index, self.validate = num_classes, ignore_index, validate
        self.add_state("matrix", torch.zeros(num_classes, num_classes, dtype=torch.int64), "sum")

    def update(self, pred: torch.Tensor, target: torch.Tensor) -> None:
        if self.validate:
            pred, target = as_labels(pred, "prediction"), as_labels(target, "target")
        cm = confusion_matrix(
            pred.detach(), target.detach(), self.num_classes, self.ignore_index, validate=self.validate
        )
        self.matrix += cm.cpu()

    def compute(self) -> dict[str, Any]:
        """``miou``, ``per_class_iou`` (list, NaN for absent classes), ``pixel_accuracy``, ``mean_dice``,
        ``per_class_dice``."""
        iou, dice = iou_from_confusion(self.matrix), dice_from_confusion(self.matrix)
        return {
            "miou": _nanmean(iou),
            "per_class_iou": iou.tolist(),
            "pixel_accuracy": pixel_accuracy(self.matrix),
            "mean_dice": _nanmean(dice),
            "per_class_dice": dice.tolist(),
        }
