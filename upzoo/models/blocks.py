"""Small building blocks of the models: conv + norm + activation, for any ``spatial_dims``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from torch import nn

from upzoo.errors import ConfigError
from upzoo.layers import batch_norm_nd, conv_nd, instance_norm_nd

__all__ = ["Norm", "Act", "make_norm", "make_act", "ConvNormAct", "DoubleConv"]

Norm = Literal["batch", "instance", "group", "none"]
Act = Literal["relu", "leaky_relu", "gelu", "silu"]
_NORMS = ("batch", "instance", "group", "none")
_ACTS = ("relu", "leaky_relu", "gelu", "silu")


def make_norm(norm: str, spatial_dims: int, channels: int) -> nn.Module:
    """``batch`` / ``instance`` (affine) / ``group`` (8 groups or fewer) / ``none``."""
    if norm == "batch":
        return batch_norm_nd(spatial_dims)(channels)
    if norm == "instance":
        return instance_norm_nd(spatial_dims)(channels, affine=True)
    if norm == "group":
        groups = next(g for g in (8, 4, 2, 1) if channels % g == 0)
        return nn.GroupNorm(groups, channels)
    if norm == "none":
        return nn.Identity()
    raise ConfigError(f"norm must be one of {', '.join(_NORMS)}, got {norm!r}")


def make_act(act: str) -> nn.Module:
    """``relu`` / ``leaky_relu`` (slope 0.01) / ``gelu`` / ``silu``, in place where possible."""
    if act == "relu":
        return nn.ReLU(inplace=True)
    if act == "leaky_relu":
        return nn.LeakyReLU(0.01, inplace=True)
    if act == "gelu":
        return nn.GELU()
    if act == "silu":
        return nn.SiLU(inplace=True)
    raise ConfigError(f"act must be one of {', '.join(_ACTS)}, got {act!r}")


class ConvNormAct(nn.Sequential):
    """Conv (kernel 3 unless given, "same" padding for stride 1) -> norm -> activation.

    ``(B, C_in, *S) -> (B, C_out, *ceil(S / stride))``.
    """

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        *,
        kernel_size: int | Sequence[int] = 3,
        stride: int | Sequence[int] = 1,
        norm: str = "batch",
        act: str = "relu",
    ) -> None:
        ks = (kernel_size,) * spatial_dims if isinstance(kernel_size, int) else tuple(kernel_size)
        conv = conv_nd(spatial_dims)(
            in_channels, out_channels, ks, stride=stride, padding=tuple(k // 2 for k in ks), bias=norm == "none"
        )
        super().__init__(conv, make_norm(norm, spatial_dims, out_channels), make_act(act))


class DoubleConv(nn.Sequential):
    """Two :class:`ConvNormAct`; the first may be strided (the downsampling of an encoder stage)."""

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        *,
        stride: int | Sequence[int] = 1,
        norm: str = "batch",
        act: str = "relu",
    ) -> None:
        super().__init__(
            ConvNormAct(spatial_dims, in_channels, out_channels, stride=stride, norm=norm, act=act),
            ConvNormAct(spatial_dims, out_channels, out_channels, norm=norm, act=act),
        )
