"""``build_model(spec)``: the one way recipes, ``upzoo shapes`` and ``upzoo bench`` build a model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from torch import nn

from upzoo.config import validate_kwargs
from upzoo.errors import ConfigError, did_you_mean
from upzoo.models.dcgan import DCGANDiscriminator, DCGANGenerator
from upzoo.models.smp_adapter import smp_unet
from upzoo.models.unet import UNet

__all__ = ["ModelSpec", "build_model", "build_discriminator", "ARCHITECTURES"]

Architecture = Literal["unet", "smp_unet", "dcgan"]
ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {"unet": UNet, "smp_unet": smp_unet, "dcgan": DCGANGenerator}


@dataclass(frozen=True)
class ModelSpec:
    """A validated model description: the architecture and its constructor's keyword arguments.

    In a recipe: ``model: {architecture: unet, spatial_dims: 2, in_channels: 3, num_classes: 19, ...}``.
    """

    architecture: Architecture
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str = "model") -> "ModelSpec":
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
        return cls(architecture, validate_kwargs(ARCHITECTURES[architecture], options, path))

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
    return ARCHITECTURES[spec.architecture](**spec.options)


def build_discriminator(spec: ModelSpec | Mapping[str, Any], *, base_channels: int = 64) -> DCGANDiscriminator:
    """The discriminator matching a ``dcgan`` spec (same channels and resolution)."""
    if not isinstance(spec, ModelSpec):
        spec = ModelSpec.from_dict(spec)
    if spec.architecture != "dcgan":
        raise ConfigError(f"a discriminator goes with architecture 'dcgan', not {spec.architecture!r}")
    return DCGANDiscriminator(spec.options["out_channels"], spec.options["resolution"], base_channels=base_channels)
