"""``prepare(recipe)``: the one place where a recipe's model and its data are reconciled —
``strides: auto`` planned from the voxel spacing, class counts and image channels checked against
the data, the palette and the normalisation to show images with. ``upzoo train``, ``eval``,
``shapes`` and ``bench`` all start here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from upzoo.data.conventions import image_conventions
from upzoo.data.factory import DataBundle, build_datasets
from upzoo.data.mni152 import mni152_root
from upzoo.errors import ConfigError
from upzoo.models.factory import ModelSpec
from upzoo.recipe import Recipe

__all__ = ["Prepared", "prepare", "resolve_model"]


@dataclass(frozen=True)
class Prepared:
    """A recipe ready to run: the resolved model spec and its data, consistent with each other."""

    recipe: Recipe
    spec: ModelSpec
    data: DataBundle
    num_classes: int | None  # segmentation: the classes the model predicts
    palette: np.ndarray | None  # (K, 3) uint8 class colours of the dataset, if it has them
    mean: tuple[float, ...] | None  # the image normalisation (to show normalised images)
    std: tuple[float, ...] | None

    @property
    def task(self) -> str:
        return self.recipe.task

    def data_meta(self) -> dict[str, Any]:
        """What using the trained model needs to know about its data, as plain data (checkpoints
        hold it): class names, palette, image normalisation, voxel spacing, ignore index, and for thick
        slices the thick training volume's maximum on the scale where the thin one's is 1."""
        bundle = self.data
        return {
            "class_names": list(bundle.class_names) if bundle.class_names else None,
            "palette": self.palette.tolist() if self.palette is not None else None,
            "mean": list(self.mean) if self.mean is not None else None,
            "std": list(self.std) if self.std is not None else None,
            "spacing": [float(s) for s in bundle.spacing] if bundle.spacing else None,
            "ignore_index": int(bundle.ignore_index),
            "thick_peak": bundle.thick_peak,
        }

    def model_dict(self) -> dict[str, Any]:
        """The resolved model spec as plain data (what ``recipe.yaml`` and checkpoints hold)."""
        from upzoo.recipe import plain

        return plain(self.spec.to_dict())


def _spacing(recipe: Recipe) -> tuple[float, ...]:
    """The voxel spacing ``strides: auto`` plans from: ``data.target_spacing`` when the volumes are
    resampled, else the synthetic set's or the first case's."""
    from pathlib import Path

    from upzoo.data.factory import target_spacing

    data = recipe.data
    if data.target_spacing is not None and (data.target_spacing != "median" or data.root is not None):
        return target_spacing(data, Path(data.root or "."))
    if data.root is None:
        return tuple(data.synthetic_spacing)
    from upzoo.data.volumes import VolumeDataset

    return VolumeDataset(data.root, "train", allow_outside_root=data.allow_outside_root).spacing(0)


def resolve_model(recipe: Recipe, spacing: tuple[float, ...] | None = None) -> ModelSpec:
    """The model spec with ``strides: auto`` planned (without building the datasets).

    Raises:
        ConfigError: ``strides: auto`` without volume data or a crop size.
    """
    spec = recipe.model
    if spec.options.get("strides") != "auto":
        return spec
    if recipe.data.kind != "volumes" or recipe.data.crop_size is None:
        raise ConfigError(
            "model.strides 'auto' needs volume data (data.kind: volumes, for the spacing) and "
            "data.crop_size (the patch)"
        )
    return spec.resolve_auto_strides(spacing or _spacing(recipe), recipe.data.crop_size)


def prepare(recipe: Recipe) -> Prepared:
    """Build the recipe's datasets and reconcile the model with them.

    Raises:
        ConfigError: a model whose classes or channels do not match the data. DataError: the files.
    """
    options = recipe.model.options
    if recipe.task == "gan":
        bundle = build_datasets(recipe.data, task="gan", resolution=options["resolution"])
        channels = bundle.train[0]["image"].shape[0]
        if channels != options["out_channels"]:
            raise ConfigError(
                f"model.out_channels is {options['out_channels']} but the images have {channels} channels"
            )
        return Prepared(recipe, recipe.model, bundle, None, None, None, None)
    if recipe.task == "generator_testbed":
        from upzoo.data.testbed import testbed_images

        images, root = testbed_images(recipe.data, options["resolution"], options["latent_dim"], recipe.train.seed)
        return Prepared(recipe, recipe.model, DataBundle(images, None, root), None, None, None, None)
    if recipe.task == "super_resolution":
        bundle = build_datasets(
            recipe.data, task="super_resolution", scale=options["scale"], in_channels=options.get("in_channels", 3)
        )
        return Prepared(recipe, recipe.model, bundle, None, None, None, None)
    if recipe.task in ("through_plane_sr", "through_plane_segmentation"):
        return _prepare_thick_slices(recipe)
    if recipe.task == "feature_upsampling":  # images only: labels, if any, are not used
        if recipe.data.kind == "cityscapes":
            bundle = build_datasets(recipe.data, task="segmentation")
        else:  # image folders and package photographs: their full-resolution crops ("target")
            bundle = build_datasets(recipe.data, task="super_resolution", scale=1, in_channels=3)
        return Prepared(recipe, recipe.model, bundle, None, *image_conventions(recipe.data))
    key = "classes" if "classes" in options else "num_classes"  # classes: smp's name, deprecated
    bundle = build_datasets(
        recipe.data, task="segmentation", num_classes=options.get(key), in_channels=options.get("in_channels")
    )
    spec = resolve_model(recipe, bundle.spacing)
    classes = spec.options.get(key)
    if bundle.num_classes is not None and classes != bundle.num_classes:
        raise ConfigError(
            f"model has {classes} classes but the data has {bundle.num_classes}; set model.{key}: {bundle.num_classes}"
        )
    palette, mean, std = image_conventions(recipe.data)
    check_pretrained_normalization(spec, recipe.data.kind, mean)
    return Prepared(recipe, spec, bundle, bundle.num_classes or classes, palette, mean, std)


def check_pretrained_normalization(spec: ModelSpec, kind: str, mean: tuple[float, ...] | None) -> None:
    """A pretrained encoder takes ImageNet-normalised images (and converts them to its own normalisation).

    Raises:
        ConfigError: ``encoder_weights: imagenet-lite`` with data normalised otherwise.
    """
    from upzoo.data.conventions import IMAGENET_MEAN
    from upzoo.models.pretrained import IMAGENET_LITE

    if spec.options.get("encoder_weights") == IMAGENET_LITE and (kind != "cityscapes" or mean != IMAGENET_MEAN):
        raise ConfigError(
            f"model.encoder_weights {IMAGENET_LITE!r} takes 2D RGB images normalised with the ImageNet mean and std; "
            f"this recipe's data (kind {kind!r}) is not: use data.normalize: imagenet with 2D image data"
        )


def _prepare_thick_slices(recipe: Recipe) -> Prepared:
    """The MNI152 brain in thick slices: thin intensities (super-resolution) or tissue labels
    (segmentation) as targets; ``strides: auto`` planned from the thick slices' spacing and patch."""
    from upzoo.data.mni152 import TISSUE_NAMES
    from upzoo.data.through_plane import ThickSliceBlock, ThickSlicePatches, thick_slice_volume

    data, labels = recipe.data, recipe.task == "through_plane_segmentation"
    volume = thick_slice_volume(data.slice_thickness, data.slice_noise, data.synthetic_seed)
    patch = tuple(data.crop_size or (32, 32, 32))
    train = ThickSlicePatches(volume, patch, data.patches_per_image, augment=data.augment, labels=labels)  # type: ignore[arg-type]
    thick_spacing = (volume.spacing[0] * volume.factor, *volume.spacing[1:])
    classes = {"num_classes": len(TISSUE_NAMES), "class_names": list(TISSUE_NAMES)} if labels else {}
    peak = float(volume.thick.max())  # predict scales a float thick volume as training did (by the thin maximum)
    bundle = DataBundle(
        train, ThickSliceBlock(volume), mni152_root(), spacing=volume.spacing, thick_peak=peak, **classes
    )
    if not labels:
        return Prepared(recipe, recipe.model, bundle, None, None, None, None)
    spec = recipe.model.resolve_auto_strides(thick_spacing, (patch[0] // volume.factor, *patch[1:]))
    return Prepared(recipe, spec, bundle, len(TISSUE_NAMES), None, None, None)
