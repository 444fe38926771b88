"""Recipes: YAML files with ``model``, ``data``, ``train`` (and ``eval``) sections, validated once at
load time into typed objects. ``--set train.lr=0.01`` overrides apply before validation."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence


from upzoo.config import from_dict, parse_yaml, read_yaml_file
from upzoo.errors import ConfigError, did_you_mean
from upzoo.models.factory import ModelSpec

__all__ = ["Recipe", "DataConfig", "TrainConfig", "EvalConfig", "load_recipe", "apply_overrides", "parse_recipe"]


@dataclass(frozen=True)
class DataConfig:
    """Where the data comes from and how it is batched and augmented.

    ``kind``: ``cityscapes`` (Cityscapes layout), ``volumes`` (NIfTI/.npy folders or a decathlon
    ``dataset.json``) or ``images`` (any folder of images, for GANs). ``root: null`` uses the
    embedded synthetic set of that kind, generated once into ``cache_dir`` (default
    ``$UPZOO_CACHE`` or ``~/.cache/upzoo``); ``synthetic_size`` defaults to 256x512 images or
    24x96x96 volumes. ``normalize`` defaults to ``imagenet`` for images and ``zscore`` for volumes.
    """

    kind: Literal["cityscapes", "volumes", "images"] = "cityscapes"
    root: str | None = None
    cache_dir: str | None = None
    train_split: str = "train"
    val_split: str = "val"
    synthetic_train: int = 64
    synthetic_val: int = 16
    synthetic_size: Sequence[int] | None = None
    synthetic_spacing: Sequence[float] = (5.0, 0.8, 0.8)
    synthetic_seed: int = 0
    crop_size: Sequence[int] | None = None
    resize: Sequence[int] | None = None
    augment: bool = True
    normalize: Literal["imagenet", "zscore", "ct", "minmax", "none"] | None = None
    ct_window: Sequence[float] = (-1000.0, 1000.0)
    foreground_ratio: float = 0.33
    allow_outside_root: bool = False
    batch_size: int = 4
    num_workers: int = 2


@dataclass(frozen=True)
class TrainConfig:
    """How to optimise: steps, optimiser, schedule, loss, precision, checkpoints, seed.

    ``max_steps`` caps the optimiser steps (smoke runs); ``val_every``/``checkpoint_every`` count
    steps (``None``: once per epoch); ``amp`` is bfloat16 or float16 autocast; GANs use
    ``latent_dim``, ``discriminator_base_channels`` and ``sample_every`` (steps between sample grids,
    ``None``: once per epoch).
    """

    epochs: int = 10
    max_steps: int | None = None
    optimizer: Literal["sgd", "adamw", "adam"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 1e-4
    momentum: float = 0.9
    betas: Sequence[float] = (0.9, 0.999)
    schedule: Literal["poly", "cosine", "constant"] = "poly"
    warmup_steps: int = 0
    loss: Literal["ce", "ce+dice"] = "ce"
    ignore_index: int = 255
    amp: Literal["none", "bf16", "fp16"] = "none"
    channels_last: bool = False
    grad_clip: float | None = None
    seed: int = 0
    deterministic: bool = False
    val_every: int | None = None
    log_every: int = 10
    checkpoint_every: int | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    latent_dim: int = 100
    discriminator_base_channels: int = 64
    sample_every: int | None = None


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation: sliding-window inference for volumes (patch, overlap, windows per batch) or whole
    volumes (``sliding_window: false``), and the rows of the prediction grid."""

    sliding_window: bool = True
    patch_size: Sequence[int] | None = None
    overlap: float = 0.5
    batch_size: int = 2
    grid_samples: int = 4

    def window_patch(self, crop_size: Sequence[int] | None) -> Sequence[int] | None:
        """The sliding-window patch for volumes (``patch_size``, else the training crop), or ``None``
        to run each volume whole (``sliding_window: false``; the U-Net pads it to a valid size)."""
        return (self.patch_size or crop_size) if self.sliding_window else None


@dataclass(frozen=True)
class Recipe:
    """A validated recipe. ``task`` is ``gan`` for a ``dcgan`` model, else ``segmentation``."""

    model: ModelSpec
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    source: str | None = None

    @property
    def task(self) -> Literal["segmentation", "gan"]:
        return "gan" if self.model.architecture == "dcgan" else "segmentation"

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as plain data (what a run folder's ``recipe.yaml`` holds)."""
        return {
            "model": _plain(self.model.to_dict()),
            "data": _plain(asdict(self.data)),
            "train": _plain(asdict(self.train)),
            "eval": _plain(asdict(self.eval)),
        }


_SECTIONS = ("model", "data", "train", "eval")


def _plain(value: Any) -> Any:
    """Tuples to lists, recursively: what YAML and JSON can hold."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
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
        raise ConfigError(f"{where}a recipe is a mapping with sections {', '.join(_SECTIONS)}, got {type(data).__name__}")
    for key in data:
        if key not in _SECTIONS:
            raise ConfigError(f"{where}{key}: unknown section; sections: {', '.join(_SECTIONS)}{did_you_mean(key, _SECTIONS)}")
    if "model" not in data:
        raise ConfigError(f"{where}the recipe has no 'model' section")
    try:
        return Recipe(
            model=ModelSpec.from_dict(data["model"], "model"),
            data=from_dict(DataConfig, data.get("data") or {}, "data"),
            train=from_dict(TrainConfig, data.get("train") or {}, "train"),
            eval=from_dict(EvalConfig, data.get("eval") or {}, "eval"),
            source=source,
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read a YAML recipe (safe loader), apply ``--set`` overrides, validate.

    Raises:
        ConfigError: missing file, invalid YAML, invalid content.
    """
    return parse_recipe(apply_overrides(read_yaml_file(path), overrides), source=str(path))
