"""``build_model(spec)``: the one way recipes, ``upzoo shapes`` and ``upzoo bench`` build a model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from upzoo.errors import ConfigError, did_you_mean
from upzoo.models.dcgan import DCGANDiscriminator, DCGANGenerator
from upzoo.models.feature_models import FeatureUpsampler, LinearProbe
from upzoo.models.pggan import PGGANGenerator
from upzoo.models.planning import plan_strides
from upzoo.models.smp_adapter import smp_unet
from upzoo.models.smp_decoders import smp_deeplabv3plus, smp_fpn, smp_segformer, smp_upernet
from upzoo.models.super_resolution import EDSR, ESPCN, RRDBNet
from upzoo.models.unet import UNet
from upzoo.validation import validate_kwargs

__all__ = [
    "ModelSpec", "build_model", "build_discriminator", "ARCHITECTURES", "SUPER_RESOLUTION", "FROZEN_BACKBONE",
    "LATENT_INPUT",
]  # fmt: skip

Architecture = Literal[
    "unet", "smp_unet", "smp_fpn", "smp_upernet", "smp_segformer", "smp_deeplabv3plus", "dcgan", "espcn", "edsr",
    "rrdbnet", "feature_upsampler", "linear_probe", "pggan",
]  # fmt: skip
#: the architectures of the super-resolution task
SUPER_RESOLUTION = ("espcn", "edsr", "rrdbnet")
ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {
    "unet": UNet,
    "smp_unet": smp_unet,
    "smp_fpn": smp_fpn,
    "smp_upernet": smp_upernet,
    "smp_segformer": smp_segformer,
    "smp_deeplabv3plus": smp_deeplabv3plus,
    "dcgan": DCGANGenerator,
    "espcn": ESPCN,
    "edsr": EDSR,
    "rrdbnet": RRDBNet,
    "feature_upsampler": FeatureUpsampler,
    "linear_probe": LinearProbe,
    "pggan": PGGANGenerator,
}
#: the generators: their input is a batch of latent vectors (B, latent_dim), not an image
LATENT_INPUT = ("dcgan", "pggan")
#: the architectures whose input is an image in [0, 1] that a frozen backbone normalises itself
FROZEN_BACKBONE = ("feature_upsampler", "linear_probe")


@dataclass(frozen=True)
class ModelSpec:
    """A validated model description: the architecture and its constructor's keyword arguments.

    In a recipe: ``model: {architecture: unet, spatial_dims: 2, in_channels: 3, num_classes: 19, ...}``.
    """

    architecture: Architecture
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "model") -> ModelSpec:
        """Validate ``{"architecture": ..., **options}`` against the architecture's constructor.

        Raises:
            ConfigError: unknown architecture or option (with did-you-mean), wrong types, missing keys.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping with an 'architecture' key, got {data!r}")
        options = dict(data)
        architecture = options.pop("architecture", "unet")
        if architecture not in ARCHITECTURES:
            raise ConfigError(
                f"{path}.architecture: expected one of {', '.join(ARCHITECTURES)}, got {architecture!r}"
                f"{did_you_mean(str(architecture), ARCHITECTURES)}"
            )
        auto = architecture == "unet" and options.get("strides") == "auto"
        if auto:  # planned from the data's voxel spacing when the recipe runs (resolve_auto_strides)
            options.pop("strides")
        validated = validate_kwargs(ARCHITECTURES[architecture], options, path)
        if auto:
            validated["strides"] = "auto"
        return cls(architecture, validated)

    def resolve_auto_strides(self, spacing: Sequence[float], patch_size: Sequence[int]) -> ModelSpec:
        """Replace ``strides: auto`` by :func:`~upzoo.models.plan_strides` for this spacing and patch;
        the encoder keeps as many stages as were planned."""
        if self.options.get("strides") != "auto":
            return self
        channels = list(self.options.get("channels") or (32, 64, 128, 256))
        strides = plan_strides(spacing, patch_size, max_stages=len(channels) - 1)
        if not strides:
            raise ConfigError(f"model.strides 'auto': no axis of patch {tuple(patch_size)} can be halved")
        return ModelSpec(
            self.architecture, {**self.options, "strides": strides, "channels": channels[: len(strides) + 1]}
        )

    def to_dict(self) -> dict[str, Any]:
        return {"architecture": self.architecture, **self.options}


def build_model(spec: ModelSpec | Mapping[str, Any]) -> nn.Module:
    """Build the model a spec describes (validating a plain mapping first).

    >>> net = build_model({"architecture": "unet", "spatial_dims": 2, "in_channels": 3, "num_classes": 4})
    >>> type(net).__name__
    'UNet'
    """
    if not isinstance(spec, ModelSpec):
        spec = ModelSpec.from_dict(spec)
    if spec.options.get("strides") == "auto":
        raise ConfigError(
            "model.strides 'auto' is planned from the data's voxel spacing: resolve it with "
            "ModelSpec.resolve_auto_strides(spacing, patch_size) (upzoo train does) or give strides"
        )
    return ARCHITECTURES[spec.architecture](**spec.options)


def build_discriminator(
    spec: ModelSpec | Mapping[str, Any], *, base_channels: int = 64, norm: str = "batch"
) -> DCGANDiscriminator:
    """The discriminator matching a ``dcgan`` spec (same channels and resolution)."""
    if not isinstance(spec, ModelSpec):
        spec = ModelSpec.from_dict(spec)
    if spec.architecture != "dcgan":
        raise ConfigError(f"a discriminator goes with architecture 'dcgan', not {spec.architecture!r}")
    options = spec.options
    return DCGANDiscriminator(options["out_channels"], options["resolution"], base_channels=base_channels, norm=norm)
