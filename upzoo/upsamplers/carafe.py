"""CARAFE: content-aware reassembly of features (Wang et al., ICCV 2019), pure PyTorch, 2D and 3D."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from upzoo.checks import check_odd, check_positive_int
from upzoo.layers import conv_nd
from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import Upsampler, renamed_option
from upzoo.upsamplers.reassembly import default_kernel, reassemble

__all__ = ["CarafeUpsampler"]


@register_upsampler("carafe")
class CarafeUpsampler(Upsampler):
    """CARAFE: predicted, softmax-normalised k_up x k_up kernels reassemble each output point.

    ``(B, C_in, *S) -> (B, C_out, *S * scale)``. A 1x1 conv compresses the channels, a
    ``kernel_encoder`` conv predicts ``kernel_up**n`` weights per sub-position, softmax normalises
    them, and every output point is the weighted sum of the ``kernel_up x kernel_up`` (3D: ``x
    kernel_up``) neighbourhood of its source point (computed at input resolution, no compiled ops).
    A 1x1 conv projects to ``out_channels`` when it differs from ``in_channels``. 3D, anisotropic
    scales such as (1, 2, 2) included, is upzoo's extension of the 2D paper.

    Args:
        kernel_up: reassembly kernel size (odd); default 5 in 2D (the paper), 3 in 3D (27 neighbours,
            about the 25 of 2D, and about 2D's memory per voxel).
        kernel_encoder: content-encoder kernel size (odd), 3 in the paper.
        compressed_channels: channels after compression, 64 in the paper.

    Raises:
        ConfigError: an even ``kernel_size`` or ``encoder_kernel_size``, or contradicting old and new option names.
    """

    supported_spatial_dims = (2, 3)

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        kernel_size: int | None = None,
        encoder_kernel_size: int = 3,
        embedding_channels: int = 64,
        kernel_up: int | None = None,
        kernel_encoder: int | None = None,
        compressed_channels: int | None = None,
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
        kernel_size = renamed_option("kernel_size", kernel_size, None, "kernel_up", kernel_up)
        encoder_kernel_size = renamed_option(
            "encoder_kernel_size", encoder_kernel_size, 3, "kernel_encoder", kernel_encoder
        )
        mid = renamed_option("embedding_channels", embedding_channels, 64, "compressed_channels", compressed_channels)
        kernel_size = default_kernel(kernel_size, self.spatial_dims)
        for name, k in (("kernel_size", kernel_size), ("encoder_kernel_size", encoder_kernel_size)):
            check_odd(k, f"carafe {name}")
        self.kernel_size = kernel_size
        self.encoder_kernel_size = encoder_kernel_size
        mid = check_positive_int(mid, "embedding_channels")
        conv = conv_nd(self.spatial_dims)
        self.compress = conv(self.in_channels, mid, kernel_size=1)
        self.encoder = conv(
            mid, kernel_size**self.spatial_dims * self.scale_product, kernel_size=encoder_kernel_size,
            padding=encoder_kernel_size // 2,
        )  # fmt: skip
        self.proj = (
            conv(self.in_channels, self.out_channels, kernel_size=1) if self.out_channels != self.in_channels else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """mmcv's ``CARAFEPack`` initialisation: the compressor xavier-uniform, the content encoder
        N(0, 0.001) (so a fresh block's kernels are nearly uniform), zero biases."""
        nn.init.xavier_uniform_(self.compress.weight)
        nn.init.zeros_(self.compress.bias)
        nn.init.normal_(self.encoder.weight, std=0.001)
        nn.init.zeros_(self.encoder.bias)
        if self.proj is not None:
            self.proj.reset_parameters()

    def upsample(self, x: torch.Tensor) -> torch.Tensor:
        b, _, *spatial = x.shape
        logits = self.encoder(self.compress(x))
        kernels = logits.reshape(b, self.kernel_size**self.spatial_dims, self.scale_product, *spatial).softmax(dim=1)
        y = reassemble(x, kernels, self.kernel_size, self.scale)
        return self.proj(y) if self.proj is not None else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel_size={self.kernel_size}"
