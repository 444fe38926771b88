"""Models with pluggable upsamplers: U-Net (2D/3D), an smp U-Net adapter, DCGAN, and the factory."""

from upzoo.models.dcgan import DCGAN_TRANSPOSED_OPTIONS, DCGANDiscriminator, DCGANGenerator
from upzoo.models.encoders import PlainEncoder, SmpEncoder, create_encoder, load_encoder_weights
from upzoo.models.factory import ModelSpec, build_discriminator, build_model
from upzoo.models.planning import plan_strides
from upzoo.models.smp_adapter import smp_unet
from upzoo.models.unet import UNet

__all__ = [
    "UNet",
    "DCGANGenerator",
    "DCGANDiscriminator",
    "DCGAN_TRANSPOSED_OPTIONS",
    "smp_unet",
    "plan_strides",
    "build_model",
    "build_discriminator",
    "ModelSpec",
    "PlainEncoder",
    "SmpEncoder",
    "create_encoder",
    "load_encoder_weights",
]
