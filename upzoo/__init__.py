"""upzoo: a PyTorch model zoo in which the upsampling operator is a pluggable part.

>>> import torch, upzoo
>>> up = upzoo.create_upsampler("pixel_shuffle", spatial_dims=2, in_channels=8, out_channels=4, scale=2)
>>> up(torch.zeros(1, 8, 5, 7)).shape
torch.Size([1, 4, 10, 14])
"""

from upzoo.errors import ConfigError, DataError, RegistryError, ShapeError, UpzooError
from upzoo.filters import MaskedGaussianBlur, masked_gaussian_blur  # registers the post-filter
from upzoo.models import (
    DCGANDiscriminator,
    DCGANGenerator,
    UNet,
    build_model,
    list_architectures,
    register_architecture,
)
from upzoo.models.backbones import register_run_reader
from upzoo.registry import create_upsampler, list_upsamplers, register_upsampler, upsampler_info
from upzoo.upsamplers import Upsampler  # registers the built-in blocks

__version__ = "0.1.0"

__all__ = [
    "create_upsampler",
    "list_upsamplers",
    "register_upsampler",
    "upsampler_info",
    "Upsampler",
    "masked_gaussian_blur",
    "MaskedGaussianBlur",
    "UNet",
    "DCGANGenerator",
    "DCGANDiscriminator",
    "build_model",
    "register_architecture",
    "list_architectures",
    "UpzooError",
    "ConfigError",
    "RegistryError",
    "ShapeError",
    "DataError",
    "load_model",
    "Predictor",
]


def _read_run(kind: str):
    """What models read from trained runs, from :mod:`upzoo.runs` (imported on first use: it sits
    above the models, so the root package wires it in)."""

    def read(*args, **kwargs):
        from upzoo.runs import encoder_backbone

        reader = encoder_backbone.run_encoder_backbone if kind == "encoder" else encoder_backbone.trained_upsampler
        return reader(*args, **kwargs)

    return read


register_run_reader("encoder", _read_run("encoder"))
register_run_reader("upsampler", _read_run("upsampler"))


def __getattr__(name: str):
    """``upzoo.load_model`` and ``upzoo.Predictor``, imported on first use (they pull in the
    recipe and training modules, which ``import upzoo`` alone does not need)."""
    if name in ("load_model", "Predictor"):
        from upzoo import inference

        return getattr(inference, name)
    raise AttributeError(f"module 'upzoo' has no attribute {name!r}")
