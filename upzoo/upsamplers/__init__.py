"""The built-in upsampling blocks, one family per file. Importing this package registers them all."""

from upzoo.upsamplers.anyup import AnyupUpsampler
from upzoo.upsamplers.base import Upsampler
from upzoo.upsamplers.carafe import CarafeUpsampler
from upzoo.upsamplers.dysample import DySampleUpsampler
from upzoo.upsamplers.fade import FadeUpsampler
from upzoo.upsamplers.fir import FirUpsampler
from upzoo.upsamplers.interp_conv import InterpConvUpsampler
from upzoo.upsamplers.interpolate import InterpolateUpsampler
from upzoo.upsamplers.jafar import JafarUpsampler
from upzoo.upsamplers.jbu import JbuUpsampler
from upzoo.upsamplers.loftup import LoftupUpsampler
from upzoo.upsamplers.modulated import ModulatedConv2d, ModulatedUpsampler
from upzoo.upsamplers.pixel_shuffle import PixelShuffleUpsampler, icnr_, pixel_shuffle_nd
from upzoo.upsamplers.sapa import SapaUpsampler
from upzoo.upsamplers.transposed import (
    CheckerboardWarning,
    SeparableTransposedUpsampler,
    TransposedConvUpsampler,
    transposed_output_size,
)
from upzoo.upsamplers.zero_insertion import ZeroInsertionUpsampler, insert_zeros

__all__ = [
    "Upsampler",
    "CarafeUpsampler",
    "DySampleUpsampler",
    "FadeUpsampler",
    "FirUpsampler",
    "JbuUpsampler",
    "JafarUpsampler",
    "LoftupUpsampler",
    "ModulatedUpsampler",
    "ModulatedConv2d",
    "AnyupUpsampler",
    "SapaUpsampler",
    "InterpConvUpsampler",
    "InterpolateUpsampler",
    "PixelShuffleUpsampler",
    "TransposedConvUpsampler",
    "SeparableTransposedUpsampler",
    "ZeroInsertionUpsampler",
    "CheckerboardWarning",
    "icnr_",
    "pixel_shuffle_nd",
    "transposed_output_size",
    "insert_zeros",
]
