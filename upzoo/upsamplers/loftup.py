"""LoftUp (Huang et al., ICCV 2025, "LoftUp: Learning a Coordinate-Based Feature Upsampler for
Vision Foundation Models"), pure PyTorch, written from the paper's equations: every output pixel's
coordinates and colour, as Fourier features, are the queries of a cross-attention transformer over
the low-resolution features."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError
from upzoo.registry import register_upsampler
from upzoo.upsamplers.image_guided import Band, ChannelNorm, ImageGuidedUpsampler, halo_rows, pixel_centres

__all__ = ["LoftupUpsampler", "fourier_features"]

KEY_FREQUENCIES = 5  # the low-resolution features' sine position encoding: 2 axes x 5 x (sin, cos)


def fourier_features(values: torch.Tensor, freqs: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``(B, V, H, W) -> (B, 2 * V * F, H, W)``: ``sin(f v + b_sin)`` and ``cos(f v + b_cos)`` for
    each value ``v`` and frequency ``f`` of ``freqs (F,)``; ``bias (2, V, F)`` the learned phases."""
    b, v, h, w = values.shape
    angles = values[:, :, None] * freqs[:, None, None]  # (B, V, F, H, W)
    sin = torch.sin(angles + bias[0, :, :, None, None])
    cos = torch.cos(angles + bias[1, :, :, None, None])
    return torch.cat([sin, cos], dim=1).reshape(b, 2 * v * freqs.shape[0], h, w)


def _frequencies(count: int) -> torch.Tensor:
    return torch.exp(torch.linspace(-2, 10, count, dtype=torch.float64)).float()  # FeatUp's and LoftUp's range


class _CrossAttentionLayer(nn.Module):
    """Pre-norm multi-head cross-attention and feed-forward, both residual."""

    def __init__(self, width: int, kv_channels: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm_q, self.norm_kv = nn.LayerNorm(width), nn.LayerNorm(kv_channels)
        self.q, self.k, self.v = nn.Linear(width, width), nn.Linear(kv_channels, width), nn.Linear(kv_channels, width)
        self.out = nn.Linear(width, width)
        self.feed_forward = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Linear(width, width)
        )

    def forward(self, queries: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        b, n, d = queries.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, t.shape[1], self.heads, d // self.heads).transpose(1, 2)

        kv = self.norm_kv(kv)
        q = heads(self.q(self.norm_q(queries)))
        attended = F.scaled_dot_product_attention(q, heads(self.k(kv)), heads(self.v(kv)))
        queries = queries + self.out(attended.transpose(1, 2).reshape(b, n, d))
        return queries + self.feed_forward(queries)


@register_upsampler("loftup")
class LoftupUpsampler(ImageGuidedUpsampler):
    """LoftUp: a coordinate-based cross-attention transformer from pixels to features.

    ``x (B, C, h, w), guide (B, 3, h*s, w*s) -> (B, C_out, h*s, w*s)``. Each output pixel's
    coordinates (in ``[-1, 1]``) and colour (centred) become Fourier features
    (``frequencies`` frequencies from ``e^-2`` to ``e^10``, learned phases) plus the colour, then two
    3x3 conv layers give the queries (``width`` channels). Keys and values are the features with a
    sine encoding of their cell centres. ``layers`` pre-norm cross-attention + feed-forward layers,
    a LayerNorm, a 1x1 conv to ``C`` and a LayerNorm give the output — new features, not a
    mixture of the input ones (unlike JAFAR and AnyUp).

    upzoo's differences from the authors' code (andrehuang/loftup): the colour is centred (the image
    is in [0, 1]) instead of min-max scaled over the batch, and the norms are per pixel instead of
    BatchNorm, so that ``chunk`` (output rows per band; two rows of halo for the convolutions) gives
    the whole result. The paper's training (self-distillation with SAM-refined pseudo-labels) needs
    data and weights upzoo cannot have offline; upzoo trains it with the JAFAR objective.

    Args:
        width: the transformer's width; None: ``in_channels + 20`` (the paper: the feature width
            plus the key position encoding). Divisible by ``heads``.
        frequencies: Fourier frequencies of the queries (20).
        heads: attention heads (4).
        layers: cross-attention layers (2).
        chunk: see :class:`~upzoo.upsamplers.image_guided.ImageGuidedUpsampler`.
        guide_channels: see :class:`~upzoo.upsamplers.image_guided.ImageGuidedUpsampler`.

    >>> up = LoftupUpsampler(spatial_dims=2, in_channels=12, out_channels=12, scale=16, width=16)
    >>> up(torch.rand(1, 12, 2, 3), torch.rand(1, 3, 32, 48)).shape
    torch.Size([1, 12, 32, 48])

    Raises:
        ConfigError: options out of range (named, with the value that came).
    """

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        guide_channels: int = 3,
        width: int | None = None,
        frequencies: int = 20,
        heads: int = 4,
        layers: int = 2,
        chunk: int | None = None,
    ) -> None:
        super().__init__(
            spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale,
            guide_channels=guide_channels, chunk=chunk,
        )  # fmt: skip
        key_pe = 2 * 2 * KEY_FREQUENCIES
        width = self.in_channels + key_pe if width is None else check_positive_int(width, "width")
        heads = check_positive_int(heads, "heads")
        if width % heads:
            raise ConfigError(
                f"loftup width ({width}) must be divisible by heads ({heads}); set width, e.g. "
                f"{width - width % heads + heads}"
            )
        self.width, n, values = width, check_positive_int(frequencies, "frequencies"), self.guide_channels + 2
        self.register_buffer("query_freqs", _frequencies(n), persistent=False)
        self.register_buffer("key_freqs", _frequencies(KEY_FREQUENCIES), persistent=False)
        self.query_phase = nn.Parameter(torch.randn(2, values, n))
        self.key_phase = nn.Parameter(torch.randn(2, 2, KEY_FREQUENCIES))
        start = 2 * values * n + self.guide_channels
        self.norm0 = ChannelNorm(start)
        self.conv1, self.norm1 = nn.Conv2d(start, width, 3, padding=(0, 1)), ChannelNorm(width)
        self.conv2, self.norm2 = nn.Conv2d(width, width, 3, padding=(0, 1)), ChannelNorm(width)
        kv = self.in_channels + key_pe
        depth = check_positive_int(layers, "layers")
        self.layers = nn.ModuleList(_CrossAttentionLayer(width, kv, heads) for _ in range(depth))
        self.final_norm = nn.LayerNorm(width)
        self.to_features, self.out_norm = nn.Linear(width, self.in_channels), nn.LayerNorm(self.in_channels)

    def _inputs(self, guide: torch.Tensor, top: int, bottom: int) -> torch.Tensor:
        """Normalised Fourier features and colour of guide rows ``[top, bottom)``."""
        height, width = guide.shape[-2:]
        image = guide[..., top:bottom, :] - 0.5
        rows, cols = pixel_centres(top, bottom, height, guide) * 2 - 1, pixel_centres(0, width, width, guide) * 2 - 1
        grid = torch.stack(torch.meshgrid(rows, cols, indexing="ij")).expand(image.shape[0], 2, -1, -1)
        values = torch.cat([grid, image.to(grid.dtype)], dim=1)  # the Fourier features in float32 at least
        encoded = fourier_features(values, self.query_freqs.to(grid.dtype), self.query_phase).to(guide.dtype)
        return self.norm0(torch.cat([encoded, image], dim=1))

    def queries(self, guide: torch.Tensor, band: Band) -> torch.Tensor:
        """``(B, width, rows, W)``: two 3x3 conv layers, each band read with the rows it needs and
        zeros outside the image, as the whole image is."""
        height = guide.shape[-2]
        top1, bottom1, pad1_top, pad1_bottom = halo_rows(band, 1, height)
        top0, bottom0, pad0_top, pad0_bottom = halo_rows(None if band is None else (top1, bottom1), 1, height)
        first = F.pad(self._inputs(guide, top0, bottom0), (0, 0, pad0_top, pad0_bottom))
        hidden = F.relu(self.norm1(self.conv1(first)))
        return F.relu(self.norm2(self.conv2(F.pad(hidden, (0, 0, pad1_top, pad1_bottom)))))

    def key_values(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, h*w, C + 20)``: the features and the sine encoding of their cell centres."""
        b, _, h, w = x.shape
        rows, cols = pixel_centres(0, h, h, x) * 2 - 1, pixel_centres(0, w, w, x) * 2 - 1
        grid = torch.stack(torch.meshgrid(rows, cols, indexing="ij")).expand(b, 2, -1, -1)
        encoding = fourier_features(grid, self.key_freqs.to(grid.dtype), self.key_phase).to(x.dtype)
        return torch.cat([x, encoding], dim=1).flatten(2).transpose(1, 2)

    def lift(self, x: torch.Tensor, guide: torch.Tensor, ratio: tuple[int, int]) -> torch.Tensor:
        b, c = x.shape[:2]
        kv, width = self.key_values(x), guide.shape[-1]

        def rows_of(band: Band) -> torch.Tensor:
            q = self.queries(guide, band)
            n = q.shape[-2]
            tokens = q.flatten(2).transpose(1, 2)
            for layer in self.layers:
                tokens = layer(tokens, kv)
            out = self.out_norm(self.to_features(self.final_norm(tokens)))
            return out.transpose(1, 2).reshape(b, c, n, width)

        return self.in_bands(guide.shape[-2], rows_of)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, width={self.width}, layers={len(self.layers)}"
