"""Datasets for a recipe: the embedded synthetic sets by default, real folders when ``data.root`` is set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from upzoo.errors import ConfigError

__all__ = ["DataBundle", "build_datasets", "target_spacing", "street_scenes"]

IMAGE_SIZE = (256, 512)  # default size of the synthetic street scenes
IMAGE_NORMALIZATIONS = ("imagenet", "minmax")  # minmax: pixel values scaled to [0, 1]
VOLUME_NORMALIZATIONS = ("zscore", "ct", "minmax", "none")
VOLUME_SIZE = (24, 96, 96)  # default size of the synthetic volumes


@dataclass
class DataBundle:
    """The train and validation datasets and what the loops need to know about them."""

    train: Dataset
    val: Dataset | None
    root: Path
    num_classes: int | None = None
    class_names: list[str] | None = None
    ignore_index: int = 255
    spacing: tuple[float, ...] | None = None
    thick_peak: float | None = None  # thick-slice data: the thick volume's maximum, thin volume's maximum = 1


def build_datasets(
    data: Any,
    *,
    task: str,
    resolution: int | None = None,
    num_classes: int | None = None,
    in_channels: int | None = None,
    scale: int | None = None,
) -> DataBundle:
    """Datasets for ``data`` (a :class:`~upzoo.recipe.DataConfig`).

    Raises:
        ConfigError: a data kind that does not fit the task. DataError: problems with the files.
    """
    if task == "gan":
        return _gan_images(data, int(resolution))
    if task == "super_resolution":
        return _super_resolution(data, int(scale), in_channels or 3)
    if data.kind == "package_images":
        raise ConfigError("data.kind 'package_images' is for super-resolution recipes (espcn, edsr, rrdbnet)")
    if data.kind == "cityscapes":
        return _cityscapes(data)
    if data.kind == "volumes":
        return _volumes(data, num_classes, in_channels)
    raise ConfigError(f"data.kind {data.kind!r} does not fit a segmentation recipe; use 'cityscapes' or 'volumes'")


def street_scenes(data: Any) -> Path:
    """The embedded Cityscapes-style scenes for ``data`` (generated once)."""
    from upzoo.data.synthetic import ensure_synthetic_cityscapes

    return ensure_synthetic_cityscapes(
        data.cache_dir,
        train=data.synthetic_train,
        val=data.synthetic_val,
        size=data.synthetic_size or IMAGE_SIZE,
        seed=data.synthetic_seed,
    )


def _gan_images(data: Any, resolution: int) -> DataBundle:
    """Training images and held-out real images (``val``, for the generative metrics; ``None`` for a
    plain folder without ``train_split``/``val_split`` subfolders)."""
    from upzoo.data import transforms as T
    from upzoo.data.images import ImageFolderDataset

    if data.kind == "volumes":
        raise ConfigError("data.kind 'volumes' does not fit a GAN recipe; use 'images' or 'cityscapes'")
    if data.root is None:
        from upzoo.data.synthetic.gan_images import ensure_synthetic_gan_images

        root = ensure_synthetic_gan_images(
            data.cache_dir, train=data.synthetic_train, val=data.synthetic_val, seed=data.synthetic_seed
        )
        folders = (root / "train", root / "val")
    else:
        root = Path(data.root)
        if data.kind == "cityscapes":
            folders = (root / "leftImg8bit" / data.train_split, root / "leftImg8bit" / data.val_split)
        elif (root / data.train_split).is_dir() and (root / data.val_split).is_dir():
            folders = (root / data.train_split, root / data.val_split)
        else:
            folders = (root, None)
    train = ImageFolderDataset(folders[0], T.gan_images(resolution, train=True, augment=data.augment))
    val = ImageFolderDataset(folders[1], T.gan_images(resolution, train=False)) if folders[1] else None
    return DataBundle(train=train, val=val, root=root)


SR_CROP = 96  # the default high-resolution training crop: a multiple of 2, 3 and 4


def _super_resolution(data: Any, scale: int, channels: int) -> DataBundle:
    """Random high-resolution crops and their bicubic downscales; held-out whole images."""
    from upzoo.data.super_resolution import SuperResolutionImages, SuperResolutionPatches, image_sources

    crop = tuple(data.crop_size or (SR_CROP, SR_CROP))
    if any(c % scale for c in crop):
        raise ConfigError(f"data.crop_size {list(crop)} is not a multiple of the model's scale {scale}; e.g. use "
                          f"{[c - c % scale for c in crop]}")  # fmt: skip
    if min(crop) < 4 * scale:
        raise ConfigError(f"data.crop_size {list(crop)} is too small for x{scale}: at least {4 * scale} a side")
    if data.normalize not in (None, "minmax"):
        raise ConfigError(f"data.normalize {data.normalize!r}: super-resolution takes pixels in [0, 1] (minmax)")
    scenes = street_scenes(data) if data.kind == "cityscapes" and data.root is None else None
    train_files, val_files, names = image_sources(data, scenes)
    train = SuperResolutionPatches(
        train_files, scale, channels, crop, patches_per_image=data.patches_per_image, augment=data.augment
    )
    val = SuperResolutionImages(val_files, scale, channels, names)
    root = Path(data.root) if data.root is not None else val_files[0].parent
    return DataBundle(train, val, root)


def _cityscapes(data: Any) -> DataBundle:
    from upzoo.data import transforms as T
    from upzoo.data.cityscapes import CLASS_NAMES, IGNORE_INDEX, CityscapesDataset

    normalize = _normalization(data.normalize, IMAGE_NORMALIZATIONS, "images")
    root = Path(data.root) if data.root is not None else street_scenes(data)
    train_transform = T.segmentation_2d(
        data.crop_size, train=True, normalize=normalize, augment=data.augment, resize=data.resize
    )
    train = CityscapesDataset(root, data.train_split, train_transform)
    val = CityscapesDataset(
        root, data.val_split, T.segmentation_2d(None, train=False, normalize=normalize, resize=data.resize)
    )
    return DataBundle(train, val, root, len(CLASS_NAMES), list(CLASS_NAMES), IGNORE_INDEX)


def _volumes(data: Any, num_classes: int | None, in_channels: int | None) -> DataBundle:
    from upzoo.data import transforms as T
    from upzoo.data.synthetic import ensure_synthetic_volumes
    from upzoo.data.volumes import VolumeDataset

    root = (
        Path(data.root)
        if data.root is not None
        else ensure_synthetic_volumes(
            data.cache_dir,
            train=data.synthetic_train,
            val=data.synthetic_val,
            shape=data.synthetic_size or VOLUME_SIZE,
            spacing=data.synthetic_spacing,
            seed=data.synthetic_seed,
        )
    )
    common = dict(
        target_spacing=target_spacing(data, root),
        cache_dir=data.cache_dir,
        normalize=_normalization(data.normalize, VOLUME_NORMALIZATIONS, "volumes"),
        ct_window=data.ct_window,
        num_classes=num_classes,
        channels=in_channels,
        allow_outside_root=data.allow_outside_root,
    )
    transform = T.volume_3d(train=True, augment=data.augment)
    train = VolumeDataset(
        root, "train", patch_size=data.crop_size, foreground_ratio=data.foreground_ratio, transform=transform, **common
    )
    val = VolumeDataset(root, "val", **common)
    classes = train.num_classes or num_classes
    return DataBundle(train, val, root, classes, train.class_names, 255, train.spacing(0))


def target_spacing(data: Any, root: Path) -> tuple[float, ...] | None:
    """The spacing every volume is resampled to: ``data.target_spacing``, or for ``median`` the
    per-axis median over the training cases' headers (no voxels read); ``None`` when not resampling."""
    if data.target_spacing != "median":
        return tuple(data.target_spacing) if data.target_spacing is not None else None
    from upzoo.data.resampling import median_spacing
    from upzoo.data.volumes import VolumeDataset

    cases = VolumeDataset(root, "train", allow_outside_root=data.allow_outside_root)
    return median_spacing([cases.source_spacing(i) for i in range(len(cases))])


def _normalization(choice: str | None, allowed: tuple[str, ...], what: str) -> str:
    """The recipe's ``data.normalize`` for this kind of data (its first option when unset)."""
    if choice is None:
        return allowed[0]
    if choice not in allowed:
        raise ConfigError(f"data.normalize {choice!r} does not apply to {what}; use one of {', '.join(allowed)}")
    return choice
