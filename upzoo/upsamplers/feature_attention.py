"""The attention JAFAR and AnyUp share: a 2D rotary position encoding in image coordinates, and
cross-attention whose head-averaged weights mix the backbone's features themselves (the output of
a query is a convex combination of low-resolution feature vectors), optionally in a local window."""

from __future__ import annotations

import math

import torch
from torch import nn

from upzoo.errors import ConfigError

__all__ = ["AxialRope", "FeatureCrossAttention", "window_mask"]


class AxialRope(nn.Module):
    """Rotary position encoding in 2D (Su et al. 2021, per axis): the channels of channels-last
    pixels ``(B, H, W, C)`` in four quarters; the pairs (1st, 2nd) turn by ``row * f_k``, (3rd,
    4th) by ``col * f_k``, with coordinates in ``[0, 1]`` (pixel centres) and
    ``f_k = 2 pi theta^(-k / (C/4 - 1))`` — JAFAR's frequencies (theta 100), fixed here rather than
    learned. A query at high resolution and a key
    at low resolution at the same place of the image get the same rotation."""

    def __init__(self, channels: int, theta: float = 100.0) -> None:
        super().__init__()
        if channels % 4:
            raise ConfigError(f"the rotary encoding needs channels divisible by 4, got {channels}")
        self.register_buffer(
            "freqs", 2 * math.pi * theta ** torch.linspace(0, -1, channels // 4, dtype=torch.float64).float(),
            persistent=False,
        )  # fmt: skip

    def forward(self, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        freqs = self.freqs.to(rows.dtype)  # the angles in the coordinates' precision (float32 at least)
        row_angle = (rows[:, None] * freqs)[:, None, :]  # (H, 1, C/4)
        col_angle = (cols[:, None] * freqs)[None, :, :]  # (1, W, C/4)
        (row_cos, row_sin), (col_cos, col_sin) = [(t.cos().to(x.dtype), t.sin().to(x.dtype))
                                                  for t in (row_angle, col_angle)]  # fmt: skip
        a, b, c, d = x.chunk(4, dim=-1)
        return torch.cat(
            [
                a * row_cos - b * row_sin,
                a * row_sin + b * row_cos,
                c * col_cos - d * col_sin,
                c * col_sin + d * col_cos,
            ],
            dim=-1,
        )


class FeatureCrossAttention(nn.Module):
    """``queries (B, N, D), keys (B, M, D), values (B, M, C) -> (B, N, C)``: RMS-normalised
    queries and keys, projected into ``heads`` heads, softmax of the scaled dot products per head,
    the weights averaged over the heads and applied to the values as they are (JAFAR's
    ``CrossAttention``: the output stays in the backbone's feature space). ``mask (N, M)``, True
    where a key may be attended."""

    def __init__(self, channels: int, heads: int) -> None:
        super().__init__()
        if channels % heads:
            raise ConfigError(f"qk_dim ({channels}) must be divisible by heads ({heads})")
        self.heads = heads
        self.norm_q, self.norm_k = nn.RMSNorm(channels), nn.RMSNorm(channels)
        self.q, self.k = nn.Linear(channels, channels), nn.Linear(channels, channels)

    def weights(self, queries: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The head-averaged attention weights ``(B, N, M)``."""
        b, n, d = queries.shape
        q = self.q(self.norm_q(queries)).view(b, n, self.heads, d // self.heads).transpose(1, 2)
        k = self.k(self.norm_k(keys)).view(b, keys.shape[1], self.heads, d // self.heads).transpose(1, 2)
        weights = 0
        for head in range(self.heads):  # one head's (B, N, M) scores at a time: a quarter of the memory
            scores = q[:, head] @ k[:, head].transpose(-1, -2) / math.sqrt(d // self.heads)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = weights + scores.softmax(dim=-1)
        return weights / self.heads

    def forward(
        self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.weights(queries, keys, mask) @ values


def window_mask(rows: torch.Tensor, cols: torch.Tensor, height: int, width: int, ratio: float) -> torch.Tensor:
    """``(len(rows) * len(cols), height * width)``, True where the low-resolution cell lies in the
    query's window: per axis, the cells that ``[p - ratio, p + ratio]`` (clipped to ``[0, 1]``)
    touches, ``p`` the query's coordinate in ``[0, 1]`` (AnyUp's local attention; a query always
    sees its own cell)."""

    def axis(p: torch.Tensor, n: int) -> torch.Tensor:
        first = torch.floor((p - ratio).clamp(0, 1) * n)
        last = torch.ceil((p + ratio).clamp(0, 1) * n)  # exclusive
        cells = torch.arange(n, device=p.device, dtype=p.dtype)
        return (cells >= first[:, None]) & (cells < last[:, None])  # (len(p), n)

    inside = axis(rows, height)[:, None, :, None] & axis(cols, width)[None, :, None, :]
    return inside.reshape(rows.shape[0] * cols.shape[0], height * width)
