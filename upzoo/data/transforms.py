"""albumentations pipelines built from a recipe: 2D image + mask, 3D volume + mask3d, GAN images."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # albumentations checks for updates at import

import albumentations as A  # noqa: E402
import cv2  # noqa: E402
from albumentations.pytorch import ToTensorV2  # noqa: E402

from upzoo.data.cityscapes import IGNORE_INDEX  # noqa: E402
from upzoo.data.conventions import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from upzoo.errors import ConfigError  # noqa: E402

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "segmentation_2d", "volume_3d", "gan_images"]


def _normalize(mode: Literal["imagenet", "minmax"]) -> list:
    if mode == "imagenet":
        return [A.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD)]
    if mode == "minmax":
        return [A.Normalize(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))]  # pixel values to [0, 1]
    raise ConfigError(f"2D images are normalised with 'imagenet' or 'minmax', got {mode!r}")


def segmentation_2d(
    crop_size: Sequence[int] | None,
    *,
    train: bool,
    normalize: str = "imagenet",
    augment: bool = True,
    resize: Sequence[int] | None = None,
) -> A.Compose:
    """Train: random scale 0.75-1.5, pad (ignore label) + random crop to ``crop_size``, flip, colour
    jitter. Val: the whole image. Both: optional resize, normalisation, to tensors."""
    steps: list = []
    if resize is not None:
        steps.append(A.Resize(int(resize[0]), int(resize[1]), interpolation=cv2.INTER_LINEAR))
    if train and augment:
        steps += [
            A.RandomScale(scale_limit=(-0.25, 0.5), p=1.0),
            A.HorizontalFlip(),
            A.ColorJitter(brightness=0.25, contrast=0.25, saturation=0.25, hue=0.02, p=0.8),
        ]
    if train and crop_size is not None:
        h, w = int(crop_size[0]), int(crop_size[1])
        steps += [
            A.PadIfNeeded(min_height=h, min_width=w, border_mode=cv2.BORDER_CONSTANT, fill=0, fill_mask=IGNORE_INDEX),
            A.RandomCrop(h, w),
        ]
    return A.Compose(steps + _normalize(normalize) + [ToTensorV2()])


def volume_3d(*, train: bool, augment: bool = True) -> A.Compose | None:
    """In-plane flips and 90-degree rotations of ``volume``/``mask3d`` for training; None for val."""
    if not (train and augment):
        return None
    return A.Compose([A.HorizontalFlip(), A.VerticalFlip(), A.RandomRotate90()])


def gan_images(resolution: int, *, train: bool, augment: bool = True) -> A.Compose:
    """Shorter side to ``resolution``, a square crop (random for training), flip; scaled to [-1, 1]."""
    crop = A.RandomCrop(resolution, resolution) if train else A.CenterCrop(resolution, resolution)
    steps = [A.SmallestMaxSize(max_size=resolution, interpolation=cv2.INTER_AREA), crop]
    if train and augment:
        steps.append(A.HorizontalFlip())
    return A.Compose(steps + [A.Normalize(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)), ToTensorV2()])
