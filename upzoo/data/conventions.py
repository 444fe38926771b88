"""The one rule for a dataset's conventions that outlive training: the class colours and the image
normalisation that a recipe's data implies (``prepare`` records them in checkpoints; ``load_model``
derives them for checkpoints written before they carried them)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "image_conventions"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def image_conventions(data: Any) -> tuple[np.ndarray | None, tuple[float, ...] | None, tuple[float, ...] | None]:
    """``(palette, mean, std)`` of a recipe's ``data`` section: Cityscapes-layout data has the
    Cityscapes palette and, unless ``normalize`` says otherwise, the ImageNet mean/std; other data
    has neither (volumes are normalised per volume)."""
    if data.kind != "cityscapes":
        return None, None, None
    from upzoo.data.cityscapes import PALETTE

    if data.normalize in (None, "imagenet"):
        return PALETTE, IMAGENET_MEAN, IMAGENET_STD
    return PALETTE, None, None
