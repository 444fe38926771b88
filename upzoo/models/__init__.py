"""Models with pluggable upsamplers: U-Net (2D/3D); smp's U-Net, FPN, UPerNet, SegFormer and
DeepLabV3+ with registered blocks at their upsampling points; DCGAN; the super-resolution networks
ESPCN, EDSR, RRDBNet, SRVGGNetCompact, UpConv7 and SPAN (trained weights: load_sr_weights); feature
upsampling on frozen backbones and its linear probe; and the factory."""

from upzoo.models.backbones import FrozenBackbone, build_backbone, timm_backbone
from upzoo.models.compact_sr import SPAN, SRVGGNetCompact, UpConv7
from upzoo.models.dcgan import DCGAN_TRANSPOSED_OPTIONS, DCGANDiscriminator, DCGANGenerator
from upzoo.models.encoders import PlainEncoder, SmpEncoder, create_encoder, load_encoder_weights
from upzoo.models.factory import (
    ArchitectureInfo,
    ModelSpec,
    architecture_info,
    build_discriminator,
    build_model,
    list_architectures,
    register_architecture,
)
from upzoo.models.feature_models import FeatureUpsampler, LinearProbe
from upzoo.models.pggan import PGGANGenerator
from upzoo.models.planning import plan_strides
from upzoo.models.smp_adapter import smp_unet
from upzoo.models.smp_decoders import smp_deeplabv3plus, smp_fpn, smp_segformer, smp_upernet
from upzoo.models.sr_weights import load_sr_weights
from upzoo.models.super_resolution import EDSR, ESPCN, RRDBNet, SRDiscriminator
from upzoo.models.unet import UNet

__all__ = [
    "UNet",
    "ESPCN",
    "EDSR",
    "RRDBNet",
    "SRVGGNetCompact",
    "UpConv7",
    "SPAN",
    "load_sr_weights",
    "SRDiscriminator",
    "FeatureUpsampler",
    "LinearProbe",
    "FrozenBackbone",
    "build_backbone",
    "timm_backbone",
    "DCGANGenerator",
    "DCGANDiscriminator",
    "DCGAN_TRANSPOSED_OPTIONS",
    "PGGANGenerator",
    "smp_unet",
    "smp_fpn",
    "smp_upernet",
    "smp_segformer",
    "smp_deeplabv3plus",
    "plan_strides",
    "build_model",
    "register_architecture",
    "architecture_info",
    "list_architectures",
    "ArchitectureInfo",
    "build_discriminator",
    "ModelSpec",
    "PlainEncoder",
    "SmpEncoder",
    "create_encoder",
    "load_encoder_weights",
]
