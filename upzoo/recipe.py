"""Recipes: YAML files with ``model``, ``data``, ``train`` (and ``eval``) sections, validated once at
load time into typed objects (the model against its constructor, the other sections as range-checked
models, see :mod:`upzoo.sections`). ``--set train.lr=0.01`` overrides apply before validation."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from upzoo.errors import ConfigError, did_you_mean
from upzoo.models.factory import ModelSpec
from upzoo.sections import DataConfig, EvalConfig, TrainConfig, validate_section
from upzoo.yaml_files import parse_yaml, read_yaml_file

__all__ = [
    "Recipe",
    "DataConfig",
    "TrainConfig",
    "EvalConfig",
    "load_recipe",
    "apply_overrides",
    "parse_recipe",
    "recipe_json_schema",
    "check_model_builds",
]


@dataclass(frozen=True)
class Recipe:
    """A validated recipe. ``task`` is the architecture's (:func:`~upzoo.models.register_architecture`):
    ``gan`` for a ``dcgan`` model, ``super_resolution`` for ``espcn``, ``edsr`` and ``rrdbnet``,
    ``feature_upsampling`` (the JAFAR objective) for ``feature_upsampler``, ``generator_testbed``
    (Schwarz et al.'s regression) for ``pggan``, else ``segmentation`` (``linear_probe`` included)."""

    model: ModelSpec
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    source: str | None = None

    @property
    def task(self) -> str:
        from upzoo.models.factory import architecture_info

        return architecture_info(self.model.architecture).task

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as plain data (what a run folder's ``recipe.yaml`` holds)."""
        return {
            "model": plain(self.model.to_dict()),
            "data": plain(self.data.model_dump()),
            "train": plain(self.train.model_dump()),
            "eval": plain(self.eval.model_dump()),
        }


_SECTIONS = ("model", "data", "train", "eval")


def plain(value: Any) -> Any:
    """Tuples to lists, recursively: what YAML and JSON can hold."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides (values parsed as YAML) to a raw recipe mapping.

    Raises:
        ConfigError: an override without ``=`` or without a section.
    """
    if overrides and not isinstance(data, dict):
        raise ConfigError(f"a recipe is a mapping with sections {', '.join(_SECTIONS)}, got {type(data).__name__}")
    data = copy.deepcopy(data)
    for item in overrides:
        path, sep, raw = item.partition("=")
        keys = path.strip().split(".")
        if not sep or len(keys) < 2 or not all(keys):
            raise ConfigError(f"--set takes section.key=value (e.g. model.upsampler=pixel_shuffle), got {item!r}")
        value = parse_yaml(raw, f"--set {item!r}")
        node = data
        for key in keys[:-1]:
            if node.get(key) is None:
                node[key] = {}
            node = node[key]
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {key!r} is not a section")
        node[keys[-1]] = value
    return data


def parse_recipe(data: Any, source: str | None = None) -> Recipe:
    """Validate a raw recipe mapping into a :class:`Recipe`.

    Raises:
        ConfigError: unknown sections or keys (with their path and a did-you-mean), wrong types.
    """
    where = f"{source}: " if source else ""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{where}a recipe is a mapping with sections {', '.join(_SECTIONS)}, got {type(data).__name__}"
        )
    for key in data:
        if key not in _SECTIONS:
            raise ConfigError(
                f"{where}{key}: unknown section; sections: {', '.join(_SECTIONS)}{did_you_mean(key, _SECTIONS)}"
            )
    if "model" not in data:
        raise ConfigError(f"{where}the recipe has no 'model' section")
    try:
        recipe = Recipe(
            model=ModelSpec.from_dict(data["model"], "model"),
            data=validate_section(DataConfig, data.get("data"), "data"),
            train=validate_section(TrainConfig, data.get("train"), "train"),
            eval=validate_section(EvalConfig, data.get("eval"), "eval"),
            source=source,
        )
        _check_model_fits_data(recipe)
        check_model_builds(recipe.model)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None
    return recipe


def check_model_builds(spec: ModelSpec) -> None:
    """Build the model on the meta device (no memory, no weights), so that its constructor's range
    checks (``num_classes`` >= 1, positive channels, ...) refuse a bad recipe when it is loaded; on
    the CPU where the constructor reads a tensor's value (MiT's drop-path rates)."""
    import warnings

    import torch

    from upzoo.models.factory import build_model

    if spec.options.get("strides") == "auto":  # planned from the data later: built here with isotropic
        dims = spec.options.get("spatial_dims", 3)  # strides, so that a bad block or option is refused now
        if dims not in (2, 3):
            return  # the model names a wrong spatial_dims when the planned strides build it
        spec = spec.resolve_auto_strides((1.0,) * dims, (256,) * dims)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warnings come again when the real model is built
        try:
            try:
                with torch.device("meta"):
                    build_model(spec)
            except (RuntimeError, NotImplementedError) as exc:  # weights loaded into meta tensors
                if "meta tensor" not in str(exc):
                    raise
                build_model(spec)
        except ConfigError as exc:
            raise ConfigError(f"model: {exc}") from None


#: train keys that only some tasks read: set to anything but their default elsewhere, they are refused
#: (a setting that is quietly ignored is worse than an error)
_TASK_KEYS = {
    "loss": ("segmentation", "through_plane_segmentation"),
    "class_weights": ("segmentation",),
    "discriminator_norm": ("gan",),
    "sample_every": ("gan",),
    "discriminator_base_channels": ("gan", "super_resolution"),
    "adversarial_weight": ("super_resolution",),
    "perceptual_weight": ("super_resolution",),
    "feature_ratios": ("feature_upsampling",),
    "consistency_weight": ("feature_upsampling",),
    "feature_guide": ("feature_upsampling",),
}


def _check_task_keys(recipe: Recipe) -> None:
    """Refuse a ``train`` key set for a task that does not read it, naming the tasks that do."""
    from upzoo.sections import TrainConfig

    for key, tasks in _TASK_KEYS.items():
        value, default = getattr(recipe.train, key), TrainConfig.model_fields[key].default
        if value != default and recipe.task not in tasks:
            raise ConfigError(
                f"train.{key} is read by {' and '.join(tasks)} recipes only, and this is a {recipe.task} recipe "
                f"({recipe.model.architecture}); remove it"
            )
    if recipe.train.discriminator_base_channels != 64 and recipe.task == "super_resolution":
        if recipe.train.adversarial_weight == 0:
            raise ConfigError(
                "train.discriminator_base_channels sizes the discriminator of train.adversarial_weight > 0, which "
                "is 0 here; remove it or set adversarial_weight"
            )


#: data keys the generator testbed does not read (it regresses whole images at the model's resolution)
_TESTBED_UNREAD = ("crop_size", "resize", "normalize", "synthetic_size", "synthetic_val")


def _refuse_unread(recipe: Recipe, keys: Sequence[str], reader: str) -> None:
    """Refuse the first of ``keys`` that ``recipe.data`` sets to anything but its default, which
    ``reader`` (a phrase naming who does not read it, and why) would quietly ignore."""
    from upzoo.sections import DataConfig

    for key in keys:
        if getattr(recipe.data, key) != DataConfig.model_fields[key].default:
            raise ConfigError(f"data.{key} is not read {reader}; remove it")


def _check_testbed_data(recipe: Recipe) -> None:
    """Refuse a ``data`` key that a generator-testbed recipe would quietly ignore."""
    if recipe.task == "generator_testbed":
        _refuse_unread(recipe, _TESTBED_UNREAD, "by the generator testbed (it regresses whole images at "
                       "model.resolution, every one of them, unnormalised in [-1, 1])")  # fmt: skip


#: data keys through-plane super-resolution does not read (the brain is one volume from nilearn's wheel)
_MNI152_UNREAD = (
    "root", "cache_dir", "train_split", "val_split", "synthetic_train", "synthetic_val", "synthetic_size",
    "synthetic_spacing", "target_spacing", "resize", "normalize", "foreground_ratio", "ct_window", "allow_outside_root",
)  # fmt: skip


def _check_through_plane(recipe: Recipe) -> None:
    """``through_plane_sr`` and ``through_plane_segmentation`` train on ``mni152`` (and ``mni152`` feeds
    nothing else), the model's scale is the slab's, the classes are the template's tissues, and no
    data key they would quietly ignore is set."""
    through_plane = recipe.task in ("through_plane_sr", "through_plane_segmentation")
    if through_plane != (recipe.data.kind == "mni152"):
        raise ConfigError(
            f"data.kind {recipe.data.kind!r} does not fit a {recipe.task} recipe ({recipe.model.architecture}): "
            f"through_plane_sr and through_plane_segmentation train on data.kind mni152, and mni152 feeds them only"
        )
    if not through_plane:
        return
    from upzoo.data.slabs import slab_factor

    _refuse_unread(recipe, _MNI152_UNREAD, "for data.kind mni152 (one template from nilearn's wheel, its T1 in "
                   "[0, 1], split by coronal_split)")  # fmt: skip
    factor = slab_factor(recipe.data.slice_thickness, 1.0)  # the template's voxels are 1 mm
    scale = recipe.model.options.get("scale")
    if scale != [factor, 1, 1] and scale != (factor, 1, 1):
        other = f" (or data.slice_thickness: {scale[0]})" if isinstance(scale, (list, tuple)) and scale else ""
        raise ConfigError(
            f"model.scale {scale!r} does not match {recipe.data.slice_thickness:g} mm slices of the 1 mm template: "
            f"use scale: [{factor}, 1, 1]{other}"
        )
    _check_tissue_classes(recipe)


def _check_tissue_classes(recipe: Recipe) -> None:
    """Segmentation from thick slices predicts the template's tissue labels, all of them."""
    from upzoo.data.mni152 import TISSUE_NAMES

    classes = recipe.model.options.get("num_classes")
    if recipe.task == "through_plane_segmentation" and classes != len(TISSUE_NAMES):
        raise ConfigError(
            f"model.num_classes {classes!r} does not match the MNI152 tissue labels ({', '.join(TISSUE_NAMES)}): "
            f"use num_classes: {len(TISSUE_NAMES)}"
        )


def _check_model_fits_data(recipe: Recipe) -> None:
    """A 3D model trains on volumes, a 2D one on images, a frozen backbone on pixels in [0, 1]; the
    adversarial term is super-resolution's, the feature ratios the feature-upsampling objective's."""
    _check_task_keys(recipe)
    _check_testbed_data(recipe)
    _check_through_plane(recipe)
    from upzoo.models.factory import architecture_info

    if architecture_info(recipe.model.architecture).frozen_backbone:
        probe = recipe.model.architecture == "linear_probe"
        kinds = ("cityscapes",) if probe else ("cityscapes", "images", "package_images")
        if recipe.data.kind not in kinds:
            what = "labelled 2D images" if probe else "2D images"
            raise ConfigError(
                f"{recipe.model.architecture} trains on {what}: data.kind {' or '.join(kinds)}, not "
                f"{recipe.data.kind!r}"
            )
        if recipe.data.normalize != "minmax":
            raise ConfigError(
                f"{recipe.model.architecture} takes pixels in [0, 1] and its backbone normalises them as it was "
                f"trained: set data.normalize: minmax, not {recipe.data.normalize!r}"
            )
        return
    if recipe.task != "segmentation":
        return
    dims, kind = recipe.model.options.get("spatial_dims", 2), recipe.data.kind
    if (dims == 3) != (kind == "volumes"):
        fix = "volumes" if dims == 3 else "cityscapes"
        raise ConfigError(
            f"model.spatial_dims is {dims} but data.kind is {kind!r}; use data.kind: {fix} or change model.spatial_dims"
        )


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read a YAML recipe (safe loader), apply ``--set`` overrides, validate.

    Raises:
        ConfigError: missing file, invalid YAML, invalid content.
    """
    return parse_recipe(apply_overrides(read_yaml_file(path), overrides), source=str(path))


def recipe_json_schema() -> dict[str, Any]:
    """The JSON Schema of a recipe: ``data``, ``train`` and ``eval`` in full (types, ranges,
    defaults); ``model`` names its architectures and, per architecture (``if``/``then``), the keys of
    its constructor (unet where ``architecture`` is left out)."""
    from pydantic import BaseModel, ConfigDict, Field

    from upzoo.models.factory import ARCHITECTURES, architecture_info
    from upzoo.validation import kwargs_json_schema

    per_architecture = []
    for name in ARCHITECTURES.names():
        keys = kwargs_json_schema(architecture_info(name).builder)
        keys["properties"] = {"architecture": {"const": name}, **keys["properties"]}
        if name in ("unet", "through_plane_unet"):  # strides: auto, planned from the voxel spacing (ModelSpec)
            keys["properties"]["strides"] = {"anyOf": [keys["properties"]["strides"], {"const": "auto"}]}
        condition = {"properties": {"architecture": {"const": name}}}
        if name != "unet":  # a model without architecture is a unet
            condition["required"] = ["architecture"]
        per_architecture.append({"if": condition, "then": keys})

    class RecipeSchema(BaseModel):
        model_config = ConfigDict(extra="forbid", title="upzoo recipe")
        model: dict[str, Any] = Field(
            description="architecture plus the keyword arguments of its constructor (see docs/recipes.md)",
            json_schema_extra={
                "properties": {"architecture": {"enum": ARCHITECTURES.names(), "default": "unet"}},
                "allOf": per_architecture,
            },
        )
        data: DataConfig = Field(default_factory=DataConfig)
        train: TrainConfig = Field(default_factory=TrainConfig)
        eval: EvalConfig = Field(default_factory=EvalConfig)

    schema = RecipeSchema.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
