"""Metrics: dataset-level confusion matrix, IoU, mIoU, pixel accuracy, Dice; Boundary IoU, the
boundary F-score and DAVIS's boundary F-measure (2D); HD95 and the normalised surface Dice (3D, in
mm); image checkerboard."""

from upzoo.metrics.boundary import BoundaryFScore, BoundaryIoU, boundary_fscore, boundary_iou
from upzoo.metrics.checkerboard import image_checkerboard
from upzoo.metrics.confusion import (
    ConfusionMatrix,
    confusion_matrix,
    dice_from_confusion,
    iou_from_confusion,
    mean_iou,
    pixel_accuracy,
)
from upzoo.metrics.davis import davis_fmeasure
from upzoo.metrics.surface import SurfaceMetrics, hausdorff95, surface_dice, surface_distances, surface_metrics

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
    "BoundaryFScore",
    "boundary_fscore",
    "davis_fmeasure",
    "SurfaceMetrics",
    "hausdorff95",
    "surface_dice",
    "surface_distances",
    "surface_metrics",
]
