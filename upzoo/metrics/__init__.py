"""Metrics: dataset-level confusion matrix, IoU, mIoU, pixel accuracy, Dice; Boundary IoU; image
checkerboard."""

from upzoo.metrics.boundary import BoundaryIoU, boundary_iou
from upzoo.metrics.checkerboard import image_checkerboard
from upzoo.metrics.confusion import (
    ConfusionMatrix,
    confusion_matrix,
    dice_from_confusion,
    iou_from_confusion,
    mean_iou,
    pixel_accuracy,
)

__all__ = [
    "ConfusionMatrix",
    "confusion_matrix",
    "dice_from_confusion",
    "iou_from_confusion",
    "mean_iou",
    "pixel_accuracy",
    "image_checkerboard",
    "BoundaryIoU",
    "boundary_iou",
]
