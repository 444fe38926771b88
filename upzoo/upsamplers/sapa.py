"""SAPA (Lu et al., NeurIPS 2022, "SAPA: Similarity-Aware Point Affiliation for Feature
Upsampling"), pure PyTorch, 2D and 3D, guided by the encoder feature at the output resolution."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_odd, check_positive_int
from upzoo.errors import ConfigError
from upzoo.layers import conv_nd
from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import Upsampler
from upzoo.upsamplers.local_similarity import local_similarity, tile_for, tiled_queries
from upzoo.upsamplers.reassembly import default_kernel, neighbourhoods, reassemble

__all__ = ["SapaUpsampler"]

Variant = Literal["bilinear", "inner"]
Border = Literal["zeros", "masked"]


@register_upsampler("sapa")
class SapaUpsampler(Upsampler):
    """SAPA: each output point affiliates with the decoder points of its source neighbourhood it is
    similar to.

    ``x (B, C_in, *S), guide (B, C_guide, *S * scale) -> (B, C_out, *S * scale)``. Both
    features are layer-normalised per point; the kernel of output point ``p`` over the
    ``kernel_size^n`` neighbourhood ``N(p)`` of its source point is
    ``softmax_{q in N(p)} sim(guide_p, x_q)`` and the output is the kernel-weighted sum of ``x`` over
    ``N(p)`` (the decoder feature itself, not normalised). Neighbours outside the image: with
    ``border="zeros"`` (the default, as the authors' kernels and upzoo's CARAFE and FADE) they stay in
    the softmax with similarity 0 and value 0; with ``border="masked"`` they take no part (the
    behaviour before this option). The similarity is

    * ``bilinear`` (SAPA-B, the released model): ``(W_q guide_p)ᵀ (W_k x_q)`` with learned
      projections to ``embedding_channels``;
    * ``inner`` (SAPA-I, no learned parameters): ``guide_pᵀ x_q``; needs ``guide_channels ==
      in_channels``.

    The paper's gated variant (SAPA-G) is not included. Everything runs at the input resolution
    (queries rearranged to their source points), and a 1x1 conv projects to ``out_channels`` when it
    differs. When the guide is no wider than the embedding, SAPA-B's query projection is folded onto
    the keys (``qᵀW_qᵀk = qᵀ(W_qᵀk)``): the same similarity up to rounding, at about SAPA-I's cost.
    3D (anisotropic scales included) is upzoo's extension of the 2D paper: the same steps over the
    ``k x k x k`` neighbourhood.

    Args:
        guide_channels: channels of the guide (the encoder skip).
        kernel_size: neighbourhood (odd); default 5 in 2D (the paper), 3 in 3D.
        embedding_channels: width of the query/key projections (``bilinear``), 64 in the paper.
        variant: ``bilinear`` or ``inner``.
        border: ``zeros`` (the authors') or ``masked``, see above.

    >>> up = SapaUpsampler(spatial_dims=2, in_channels=8, out_channels=8, scale=2, guide_channels=4)
    >>> up(torch.rand(1, 8, 5, 6), torch.rand(1, 4, 10, 12)).shape
    torch.Size([1, 8, 10, 12])

    Raises:
        ConfigError: an even ``kernel_size``, or a ``variant`` or ``border`` that does not exist.
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
        variant: Variant = "bilinear",
        border: Border = "zeros",
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
        self.guide_channels = check_positive_int(guide_channels, "guide_channels")
        kernel_size = default_kernel(kernel_size, self.spatial_dims)
        check_odd(kernel_size, "sapa kernel_size")
        if variant not in ("bilinear", "inner"):
            raise ConfigError(f"sapa variant must be 'bilinear' or 'inner', got {variant!r}")
        if variant == "inner" and self.guide_channels != self.in_channels:
            raise ConfigError(
                f"sapa variant 'inner' compares features directly: guide_channels "
                f"({self.guide_channels}) must equal in_channels ({self.in_channels}); use 'bilinear'"
            )
        if border not in ("zeros", "masked"):
            raise ConfigError(f"sapa border must be 'zeros' or 'masked', got {border!r}")
        self.kernel_size, self.variant, self.border = kernel_size, variant, border
        learned = variant == "bilinear"
        self.norm_guide = nn.LayerNorm(self.guide_channels, elementwise_affine=learned)
        self.norm_x = nn.LayerNorm(self.in_channels, elementwise_affine=learned)
        mid = check_positive_int(embedding_channels, "embedding_channels")
        self.query = nn.Linear(self.guide_channels, mid) if learned else None
        self.key = nn.Linear(self.in_channels, mid) if learned else None
        conv = conv_nd(self.spatial_dims)
        self.proj = conv(self.in_channels, self.out_channels, 1) if self.out_channels != self.in_channels else None
        if learned:
            for projection in (self.query, self.key):
                nn.init.trunc_normal_(projection.weight, std=0.02)
                nn.init.zeros_(projection.bias)

    def kernels(self, x: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
        """Softmax-normalised affiliation kernels ``(B, k^n, prod(scale), *S)``. Computed channels-last:
        the queries, tile by tile at their source points, times the key neighbourhoods (keys
        zero-padded, so a neighbour outside has similarity 0: border "zeros"); see
        :mod:`upzoo.upsamplers.local_similarity`."""
        # Tiles are the eager speed path; a traced graph (compile, export, ONNX) takes tiles of one
        # point, where the window is the neighbourhood itself: the same sums, and sizes that stay
        # expressions of the input's at any scale.
        tile = 1 if torch.compiler.is_compiling() else tile_for(self.spatial_dims)
        queries, k = tiled_queries(guide, self.scale, tile), self.norm_x(x.movedim(1, -1))
        if self.query is None:
            similarity = local_similarity(self.norm_guide(queries), k, self.kernel_size, tile)  # (B, *S, r, k^n)
        elif self.guide_channels <= self.query.out_features:
            similarity = self._folded_similarity(queries, self.key(k), tile)
        else:
            q = self.query(self.norm_guide(queries))
            similarity = local_similarity(q, self.key(k), self.kernel_size, tile)
        if self.border == "masked":
            inside = neighbourhoods(torch.ones_like(k[:1, ..., :1]), self.kernel_size).transpose(-1, -2)
            similarity = similarity.masked_fill(inside == 0, float("-inf"))
        n = self.spatial_dims
        return similarity.softmax(dim=-1).permute(0, n + 2, n + 1, *range(1, n + 1))

    def _folded_similarity(self, queries: torch.Tensor, keys: torch.Tensor, tile: int) -> torch.Tensor:
        """SAPA-B's similarity with the guide's LayerNorm affine and the query projection moved onto
        the keys: with ``n`` the normalised guide, ``(W_q (γ n + β) + b_q)ᵀ k = nᵀ (γ W_qᵀ k) +
        βᵀ W_qᵀ k + b_qᵀ k``. The ``r``-times more numerous queries (one per output point) are only
        normalised, and need no gradient unless the guide does; the keys at the input resolution
        are projected into the guide's width. Used when that is no wider than the embedding (the
        same or less work and memory: SAPA-B then costs about what SAPA-I does). Equal to the
        plain order up to rounding."""
        norm = self.norm_guide
        folded = keys @ self.query.weight  # (B, *S, C_guide): W_qᵀ k
        bias = (folded @ norm.bias + keys @ self.query.bias).unsqueeze(-1)  # (B, *S, 1)
        normalised = F.layer_norm(queries, norm.normalized_shape, eps=norm.eps)
        similarity = local_similarity(normalised, folded * norm.weight, self.kernel_size, tile)
        return similarity + neighbourhoods(bias, self.kernel_size).transpose(-1, -2)

    def upsample(self, x: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
        y = reassemble(x, self.kernels(x, guide), self.kernel_size, self.scale)
        return self.proj(y) if self.proj is not None else y

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, guide_channels={self.guide_channels}, variant={self.variant!r}, "
            f"border={self.border!r}"
        )
