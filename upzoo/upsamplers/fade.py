"""FADE (Lu et al., ECCV 2022, "FADE: Fusing the Assets of Decoder and Encoder for Task-Agnostic
Upsampling"), pure PyTorch, 2D and 3D, guided by the encoder feature at the output resolution."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_odd, check_positive_int
from upzoo.layers import conv_nd
from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import Upsampler
from upzoo.upsamplers.reassembly import default_kernel, pixel_unshuffle_nd, reassemble

__all__ = ["FadeUpsampler"]


@register_upsampler("fade")
class FadeUpsampler(Upsampler):
    """FADE: reassembly kernels from decoder *and* encoder, and a gate between detail and semantics.

    ``x (B, C_in, *S), guide (B, C_guide, *S * scale) -> (B, C_out, *S * scale)``.

    * Kernels by *semi-shift convolution*: both features are compressed to ``embedding_channels``
      by 1x1 convs, one shared ``encoder_kernel_size`` conv predicts ``kernel_size^n`` logits from
      each, the decoder's are repeated to the output resolution (nearest) and added to the
      encoder's, and a softmax normalises them per output point.
    * Every output point reassembles the ``kernel_size^n`` neighbourhood of its source point in
      ``x`` with its kernel (CARAFE's operator, computed at the input resolution).
    * ``gate=True``: ``g = sigmoid(up(conv1x1(x)))`` mixes the result with the guide,
      ``g * guide + (1 - g) * reassembled``; a 1x1 conv aligns the guide to ``C_in`` channels when
      they differ (the paper's features share a width).

    A 1x1 conv projects to ``out_channels`` when it differs from ``in_channels``. 3D (anisotropic
    scales included) is upzoo's extension of the 2D paper: the same steps with 3D convolutions over
    the ``k x k x k`` neighbourhood.

    Args:
        guide_channels: channels of the guide (the encoder skip).
        kernel_size: reassembly kernel (odd); default 5 in 2D (the paper), 3 in 3D.
        embedding_channels: width of the compressed features, 64 in the paper.
        encoder_kernel_size: kernel of the shared content encoder (odd), 3 in the paper.
        gate: mix with the guide by a learned gate (FADE); ``False`` is the paper's ablation
            without the gate (semi-shift reassembly alone).

    >>> up = FadeUpsampler(spatial_dims=2, in_channels=8, out_channels=8, scale=2, guide_channels=4)
    >>> up(torch.rand(1, 8, 5, 6), torch.rand(1, 4, 10, 12)).shape
    torch.Size([1, 8, 10, 12])

    Raises:
        ConfigError: an even ``kernel_size`` or ``encoder_kernel_size``.
    """

    supported_spatial_dims = (2, 3)
    needs_guide = True

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        guide_channels: int,
        kernel_size: int | None = None,
        embedding_channels: int = 64,
        encoder_kernel_size: int = 3,
        gate: bool = True,
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
        self.guide_channels = check_positive_int(guide_channels, "guide_channels")
        kernel_size = default_kernel(kernel_size, self.spatial_dims)
        for name, k in (("kernel_size", kernel_size), ("encoder_kernel_size", encoder_kernel_size)):
            check_odd(k, f"fade {name}")
        self.kernel_size = kernel_size
        mid = check_positive_int(embedding_channels, "embedding_channels")
        conv = conv_nd(self.spatial_dims)
        self.compress_guide = conv(self.guide_channels, mid, 1)
        self.compress_x = conv(self.in_channels, mid, 1, bias=False)
        self.content = conv(mid, kernel_size**self.spatial_dims, encoder_kernel_size, padding=encoder_kernel_size // 2)
        self.gate = conv(self.in_channels, 1, 1) if gate else None
        needs_align = gate and self.guide_channels != self.in_channels
        self.align = conv(self.guide_channels, self.in_channels, 1) if needs_align else None
        self.proj = conv(self.in_channels, self.out_channels, 1) if self.out_channels != self.in_channels else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The authors' initialisation (poppinace/fade, ``FADE_H2L.py``): the shared content conv
        xavier-normal, the compressions and the gate xavier-uniform, zero biases."""
        nn.init.xavier_normal_(self.content.weight)
        nn.init.zeros_(self.content.bias)
        for conv in (self.compress_guide, self.compress_x):
            nn.init.xavier_uniform_(conv.weight)
            if conv.bias is not None:
                nn.init.zeros_(conv.bias)
        if self.gate is not None:
            nn.init.xavier_uniform_(self.gate.weight)
            nn.init.zeros_(self.gate.bias)

    def kernels(self, x: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
        """Softmax-normalised kernels ``(B, k^n, prod(scale), *S)`` by semi-shift convolution."""
        up = F.interpolate(self.content(self.compress_x(x)), scale_factor=self.scale, mode="nearest")
        logits = self.content(self.compress_guide(guide)) + up
        return pixel_unshuffle_nd(logits, self.scale).softmax(dim=1)

    def upsample(self, x: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
        y = reassemble(x, self.kernels(x, guide), self.kernel_size, self.scale)
        if self.gate is not None:
            g = torch.sigmoid(F.interpolate(self.gate(x), scale_factor=self.scale, mode="nearest"))
            detail = self.align(guide) if self.align is not None else guide
            y = g * detail + (1 - g) * y
        return self.proj(y) if self.proj is not None else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, guide_channels={self.guide_channels}, kernel_size={self.kernel_size}"
