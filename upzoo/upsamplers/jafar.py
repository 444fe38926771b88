"""JAFAR (Couairon et al., NeurIPS 2025, "JAFAR: Jack up Any Feature at Any Resolution"), pure
PyTorch, written from the paper's equations: queries from the high-resolution image, keys from the
same image encoding pooled to the feature grid and modulated by the features, the features as values."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from upzoo.checks import check_positive_int
from upzoo.registry import register_upsampler
from upzoo.upsamplers.feature_attention import AxialRope, FeatureCrossAttention
from upzoo.upsamplers.image_guided import Band, ImageGuidedUpsampler, PointwiseEncoder, halo_rows, pixel_centres

__all__ = ["JafarUpsampler"]


@register_upsampler("jafar")
class JafarUpsampler(ImageGuidedUpsampler):
    """JAFAR: each output pixel attends to every low-resolution feature vector.

    ``x (B, C, h, w), guide (B, 3, h*s, w*s) -> (B, C_out, h*s, w*s)``. The image is encoded per
    pixel (``E``: a 1x1 conv and residual blocks) and turned by a 2D rotary encoding of its pixel
    coordinates. Queries: ``conv3x3(norm(E_q(E(I))))`` at every output pixel. Keys: ``E_k(E(I))``
    average-pooled onto the feature grid, normalised and modulated by the features (SFT:
    ``gamma(F') * k + beta(F')`` with ``F' = E_f(x / |x|)``). Values: the features ``x`` themselves;
    the output of a pixel is ``sum_j a_j x_j`` with ``a`` the softmax weights averaged over
    ``heads`` heads — a convex combination of the features, any ratio (14 and 16 included).

    upzoo's differences from the authors' code (PaulCouairon/JAFAR): the encoders normalise each
    pixel over its channels instead of GroupNorm over the image, and the rotary frequencies are
    fixed rather than learned, so that a band of output rows depends on its rows alone: ``chunk``
    (output rows per band) bounds memory by ``heads x chunk x W x h x w`` attention weights, equal
    to the whole computation. The query and key encodings are computed at the guide's resolution
    (the authors pool the queries from a larger image when the output is smaller than it).

    Args:
        guide_channels: channels of the guide (3: the image, in [0, 1]).
        qk_dim: width of the image encoding, queries and keys (128 in the paper; divisible by 4).
        heads: attention heads (4).
        chunk: output rows per band, or None for the whole image at once.

    >>> up = JafarUpsampler(spatial_dims=2, in_channels=16, out_channels=16, scale=14, qk_dim=32)
    >>> up(torch.rand(1, 16, 2, 3), torch.rand(1, 3, 28, 42)).shape
    torch.Size([1, 16, 28, 42])
    """

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        guide_channels: int = 3,
        qk_dim: int = 128,
        heads: int = 4,
        chunk: int | None = None,
    ) -> None:
        super().__init__(
            spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale,
            guide_channels=guide_channels, chunk=chunk,
        )  # fmt: skip
        qk = self.qk_dim = check_positive_int(qk_dim, "qk_dim")
        self.rope = AxialRope(qk)
        self.attention = FeatureCrossAttention(qk, check_positive_int(heads, "heads"))
        self.image_encoder = PointwiseEncoder(self.guide_channels, qk)
        self.query_encoder, self.key_encoder = PointwiseEncoder(qk, qk), PointwiseEncoder(qk, qk)
        self.query_norm = nn.LayerNorm(qk, elementwise_affine=False)
        self.query_conv = nn.Conv2d(qk, qk, 3, padding=(0, 1), bias=False)
        self.build_key_path()

    def build_key_path(self) -> None:
        """JAFAR's keys: the SFT modulation by the normalised features."""
        qk = self.qk_dim
        self.feature_encoder = PointwiseEncoder(self.in_channels, qk)
        self.key_norm = nn.LayerNorm(qk, elementwise_affine=False)
        self.gamma, self.beta = nn.Linear(qk, qk, bias=False), nn.Linear(qk, qk, bias=False)

    def keys(self, x: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """``(B, h, w, qk)`` keys from the pooled image encoding ``(B, h, w, qk)`` and the features."""
        features = self.feature_encoder(F.normalize(x, dim=1).permute(0, 2, 3, 1))
        return self.gamma(features) * self.key_norm(pooled) + self.beta(features)

    def mask(self, rows: torch.Tensor, cols: torch.Tensor, size: tuple) -> torch.Tensor | None:
        """Which keys each query of these rows may attend: all (global attention)."""
        return None

    def encoded(self, guide: torch.Tensor, top: int, bottom: int) -> torch.Tensor:
        """The rotary-encoded image encoding of guide rows ``[top, bottom)``, ``(B, rows, W, qk)``."""
        height, width = guide.shape[-2:]
        encoding = self.image_encoder(guide[..., top:bottom, :].permute(0, 2, 3, 1))
        rows, cols = pixel_centres(top, bottom, height, encoding), pixel_centres(0, width, width, encoding)
        return self.rope(encoding, rows, cols)

    def pooled_keys(self, guide: torch.Tensor, ratio: tuple[int, int], encoded: torch.Tensor | None) -> torch.Tensor:
        """``E_k(E(I))`` average-pooled onto the feature grid, ``(B, h, w, qk)``: from ``encoded``
        (the whole image's encoding) when given, else in bands of whole feature rows."""
        if encoded is not None:
            return self._pool(self.key_encoder(encoded), ratio)
        height = guide.shape[-2]
        bands = [(0, height)]
        if self.banded(height):
            step = -(-self.chunk // ratio[0]) * ratio[0]
            bands = [(s, min(s + step, height)) for s in range(0, height, step)]

        def part(start: int, stop: int) -> torch.Tensor:
            return self._pool(self.key_encoder(self.encoded(guide, start, stop)), ratio)

        if len(bands) > 1 and torch.is_grad_enabled():  # training: a band's encodings freed, recomputed later
            return torch.cat([checkpoint(part, s, e, use_reentrant=False) for s, e in bands], dim=1)
        return torch.cat([part(s, e) for s, e in bands], dim=1) if len(bands) > 1 else part(*bands[0])

    @staticmethod
    def _pool(pixels: torch.Tensor, ratio: tuple[int, int]) -> torch.Tensor:
        return F.avg_pool2d(pixels.permute(0, 3, 1, 2), ratio, ratio).permute(0, 2, 3, 1)

    def queries(self, guide: torch.Tensor, band: Band, encoded: torch.Tensor | None) -> torch.Tensor:
        """``(B, qk, rows, W)`` queries of a band of output rows (one row of halo for the 3x3 conv);
        the whole image's from ``encoded`` when given."""
        top, bottom, pad_top, pad_bottom = halo_rows(band, 1, guide.shape[-2])
        encoded = self.encoded(guide, top, bottom) if band is not None or encoded is None else encoded
        q = self.query_norm(self.query_encoder(encoded)).permute(0, 3, 1, 2)
        return self.query_conv(F.pad(q, (0, 0, pad_top, pad_bottom)))

    def lift(self, x: torch.Tensor, guide: torch.Tensor, ratio: tuple[int, int]) -> torch.Tensor:
        b, c, h, w = x.shape
        height, width = guide.shape[-2:]
        encoded = None if self.banded(height) else self.encoded(guide, 0, height)  # computed once for keys and queries
        keys = self.keys(x, self.pooled_keys(guide, ratio, encoded)).flatten(1, 2)  # (B, hw, qk)
        values = x.flatten(2).transpose(1, 2)  # (B, hw, C)
        cols = pixel_centres(0, width, width, x)

        def rows_of(band: Band) -> torch.Tensor:
            q = self.queries(guide, band, encoded)
            n = q.shape[-2]
            start = 0 if band is None else band[0]
            rows = pixel_centres(start, start + n, height, x)
            out = self.attention(q.permute(0, 2, 3, 1).flatten(1, 2), keys, values, self.mask(rows, cols, (h, w)))
            return out.transpose(1, 2).reshape(b, c, n, width)

        return self.in_bands(height, rows_of)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, qk_dim={self.qk_dim}, heads={self.attention.heads}"
