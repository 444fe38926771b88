"""AnyUp (Wimmer et al., ICLR 2026, "AnyUp: Universal Feature Upsampling"), pure PyTorch, written from
the paper's equations: JAFAR's attention with feature-agnostic keys and a local window."""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_odd
from upzoo.errors import ConfigError
from upzoo.registry import register_upsampler
from upzoo.upsamplers.feature_attention import window_mask
from upzoo.upsamplers.image_guided import PointwiseEncoder
from upzoo.upsamplers.jafar import JafarUpsampler

__all__ = ["AnyupUpsampler", "FeatureUnification"]


class FeatureUnification(nn.Module):
    """AnyUp's feature-agnostic layer: ``(B, C, h, w) -> (B, width, h, w)`` for any ``C``. Each
    input channel is convolved with the same ``width`` learned ``k x k`` filters (a border tap
    divides by the taps inside the image), a softmax over the filters turns each channel's responses
    into weights, and the channels are averaged: the weights do not depend on ``C``. Computed
    ``group`` channels at a time (the ``width x C`` responses never exist at once)."""

    def __init__(self, width: int, kernel_size: int = 5, group: int = 16) -> None:
        super().__init__()
        check_odd(kernel_size, "anyup kernel_size")
        self.width, self.kernel_size, self.group = width, kernel_size, group
        self.basis = nn.Parameter(torch.randn(width, 1, kernel_size, kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        k, pad = self.kernel_size, self.kernel_size // 2
        ones = torch.ones(1, 1, h, w, device=x.device, dtype=x.dtype)
        taps = F.conv2d(F.pad(ones, (pad,) * 4), torch.ones(1, 1, k, k, device=x.device, dtype=x.dtype))
        total = torch.zeros(b, self.width, h, w, device=x.device, dtype=x.dtype)
        for first in range(0, c, self.group):
            part = x[:, first : first + self.group]
            g = part.shape[1]
            responses = F.conv2d(F.pad(part, (pad,) * 4), self.basis.repeat(g, 1, 1, 1), groups=g) / taps
            total = total + responses.view(b, g, self.width, h, w).softmax(dim=2).sum(dim=1)
        return total / c


@register_upsampler("anyup")
class AnyupUpsampler(JafarUpsampler):
    """AnyUp: JAFAR's queries and head-averaged attention with the features as values, but keys that
    do not depend on the backbone's channel count, and each output pixel attends only to the feature
    cells within ``window`` (a fraction of the image side) of it.

    ``x (B, C, h, w), guide (B, 3, h*s, w*s) -> (B, C_out, h*s, w*s)``. Keys:
    ``A([pool(E_k(E(I))), E_f(U(x / |x|))])`` with ``U`` the feature-agnostic
    :class:`FeatureUnification` and ``A`` a 3x3 conv and residual blocks at the feature
    resolution. Apart from the optional 1x1 projection to ``out_channels``, no weight depends on
    ``in_channels``: :meth:`resample` takes features of any width (the block's claim: train once,
    use with any backbone). Differences from the authors' code (wimmerth/anyup) as for
    :class:`~upzoo.upsamplers.jafar.JafarUpsampler` (per-pixel norms, fixed rotary frequencies);
    the window is a mask over the dense scores (the authors also offer a NATTEN kernel).

    Args:
        window: the window's half side as a fraction of the image, in (0, 1] (0.1 in the paper).
        kernel_size: the unification filters' size (odd; 5).
        qk_dim: as :class:`~upzoo.upsamplers.jafar.JafarUpsampler`.
        heads: as JAFAR.
        chunk: as JAFAR.
        guide_channels: as JAFAR.

    >>> up = AnyupUpsampler(spatial_dims=2, in_channels=16, out_channels=16, scale=16, qk_dim=32)
    >>> up.resample(torch.rand(1, 40, 2, 3), torch.rand(1, 3, 8, 12), 4).shape  # any channel count
    torch.Size([1, 40, 8, 12])

    Raises:
        ConfigError: a ``window`` outside (0, 1], or another option out of range.
    """

    feature_agnostic = True

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
        window: float = 0.1,
        kernel_size: int = 5,
        chunk: int | None = None,
    ) -> None:
        if isinstance(window, bool) or not isinstance(window, Real) or not 0 < window <= 1:
            raise ConfigError(f"anyup window is a fraction of the image side in (0, 1], got {window!r}")
        self.window, self.kernel_size = float(window), kernel_size
        super().__init__(
            spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale,
            guide_channels=guide_channels, qk_dim=qk_dim, heads=heads, chunk=chunk,
        )  # fmt: skip

    def build_key_path(self) -> None:
        qk = self.qk_dim
        self.unification, self.feature_encoder = FeatureUnification(qk, self.kernel_size), PointwiseEncoder(qk, qk)
        self.aggregation_conv = nn.Conv2d(2 * qk, qk, 3, padding=1, bias=False)
        self.aggregation = PointwiseEncoder(qk, qk)

    def keys(self, x: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        features = self.feature_encoder(self.unification(F.normalize(x, dim=1)).permute(0, 2, 3, 1))
        both = torch.cat([pooled, features], dim=-1).permute(0, 3, 1, 2)
        return self.aggregation(self.aggregation_conv(both).permute(0, 2, 3, 1))

    def mask(self, rows: torch.Tensor, cols: torch.Tensor, size: tuple) -> torch.Tensor | None:
        return window_mask(rows, cols, size[0], size[1], self.window)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}"
