"""What feature-upsampling models read from trained runs (the root package registers both with
:func:`upzoo.models.backbones.register_run_reader`):
``backbone: "run:PATH"``, a segmentation run's encoder as a frozen backbone, and ``upsampler_run``,
the upsampler a feature-upsampling run trained."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from upzoo.checks import is_int
from upzoo.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from upzoo.errors import ConfigError
from upzoo.models.backbones import FrozenBackbone
from upzoo.runs.trained_model import load_model

__all__ = ["run_encoder_backbone", "encoder_features", "trained_upsampler"]


def encoder_features(encoder: torch.nn.Module, x: torch.Tensor, *, layer: int) -> torch.Tensor:
    """An upzoo encoder's feature at stage ``layer``."""
    return encoder(x)[layer]


def run_encoder_backbone(path: str | Path, *, layer: int | None = None) -> FrozenBackbone:
    """The encoder of the 2D segmentation run (or checkpoint) at ``path``: its stage ``layer``
    (None: the deepest), normalised as the run's data was (ImageNet's mean/std when it recorded none).

    Raises:
        ConfigError: a run whose model has no encoder (a generator, an SR network, a 3D model), a
        stage that does not exist. DataError: a missing or corrupt run.
    """
    loaded = load_model(path, purpose="taking its encoder as a backbone")
    encoder = getattr(loaded.model, "encoder", None)
    if encoder is None or getattr(encoder, "spatial_dims", 2) != 2 or not hasattr(encoder, "reductions"):
        raise ConfigError(
            f"the run at {str(path)!r} ({loaded.spec.architecture}) has no 2D encoder to take features from; "
            f"use a 2D segmentation run (unet, smp_*)"
        )
    last = len(encoder.channels) - 1
    layer = last if layer is None else layer
    if not is_int(layer) or not 0 <= layer <= last:
        raise ConfigError(
            f"the run's encoder has no layer {layer!r}: layers are 0..{last} with strides "
            f"{[r[0] for r in encoder.reductions]}"
        )
    rows, cols = encoder.reductions[layer]
    if rows != cols:
        raise ConfigError(f"the encoder's layer {layer} has strides {(rows, cols)}; a backbone needs one stride")

    return FrozenBackbone(
        encoder, functools.partial(encoder_features, layer=layer), channels=encoder.channels[layer], stride=rows,
        mean=loaded.mean or IMAGENET_MEAN, std=loaded.std or IMAGENET_STD,
        name=f"run {Path(path).name} encoder layer {layer}",
    )  # fmt: skip


def trained_upsampler(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The model options and the upsampler's weights of the feature-upsampling run at ``path``.

    Raises:
        ConfigError: a run of another architecture. DataError: a missing or corrupt run.
    """
    loaded = load_model(path, purpose="taking its trained upsampler")
    if loaded.spec.architecture != "feature_upsampler":
        raise ConfigError(
            f"upsampler_run {str(path)!r} is a {loaded.spec.architecture} run; give a feature_upsampler run "
            f"(upzoo train recipes/featup_*.yaml)"
        )
    return dict(loaded.spec.options), loaded.model.upsampler.state_dict()
