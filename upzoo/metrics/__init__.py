"""Segmentation metrics: dataset-level confusion matrix, IoU, mIoU, pixel accuracy, Dice."""

from upzoo.metrics.confusion import (
    ConfusionMatrix,
    confusion_matrix,
    dice_from_confusion,
    iou_from_confusion,
    mean_iou,
    pixel_accuracy,
)

__all__ = ["ConfusionMatrix", "confusion_matrix", "dice_from_confusion", "iou_from_confusion", "mean_iou",
           "pixel_accuracy"]
