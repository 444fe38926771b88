"""DySample: upsampling by learned point sampling (Liu et al., ICCV 2023), pure PyTorch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.errors import ConfigError
from upzoo.layers import conv_nd
from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import Upsampler
from upzoo.upsamplers.pixel_shuffle import pixel_shuffle_nd

__all__ = ["DySampleUpsampler"]


@register_upsampler("dysample")
class DySampleUpsampler(Upsampler):
    """DySample: a 1x1 conv predicts sampling offsets; the output is sampled with grid_sample.

    ``(B, C_in, *S) -> (B, C_out, *S * scale)``. Each output point ``o`` (per axis) samples the input
    at ``(o + 0.5) / scale + offset`` (in input pixels, align_corners=False), so zero offsets give
    exactly bilinear/trilinear upsampling. Offsets are bounded by the static scope factor 0.25 of the
    paper ("lp" style), or by a learned dynamic scope ``0.5 * sigmoid(conv(x))``. When ``out_channels``
    differs from ``in_channels`` a 1x1 conv projects the result. 3D works the same way (trilinear).

    Args:
        groups: channel groups with their own offsets; ``None`` picks 4 when ``in_channels`` divides
            by 4, else 1.
        dynamic_scope: learn the offset scope per point instead of the fixed 0.25.
        style: ``"lp"`` (linear then pixel-shuffle, the paper's default): the offsets of every
            sub-position come from the input point; ``"pl"`` (pixel-shuffle then linear): the input is
            pixel-shuffled to the output resolution first (``in_channels / scale²`` channels) and the
            offsets are predicted there, a lighter conv.

    Weights of the authors' module (tiny-smart/dysample) load with
    :func:`~upzoo.upsamplers.reference_weights.load_reference_state_dict`; a block built with the
    authors' arguments (``groups=4``, ``dyscope``, ``style``) computes what theirs does.

    Raises:
        ConfigError: ``in_channels`` not divisible by ``groups`` (or, for ``pl``, by ``scale²``).
    """

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        groups: int | None = None,
        dynamic_scope: bool = False,
        style: Literal["lp", "pl"] = "lp",
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
        if groups is None:
            groups = 4 if self.in_channels % 4 == 0 else 1
        if not isinstance(groups, int) or groups < 1 or self.in_channels % groups:
            raise ConfigError(
                f"dysample groups must be a positive divisor of in_channels={self.in_channels}, got {groups!r}"
            )
        if style not in ("lp", "pl"):
            raise ConfigError(f"dysample style must be 'lp' or 'pl', got {style!r}")
        if style == "pl" and self.in_channels % self.scale_product:
            raise ConfigError(
                f"dysample style 'pl' pixel-shuffles the input first: in_channels={self.in_channels} must be a "
                f"multiple of the scale product {self.scale_product}; use style 'lp'"
            )
        self.groups, self.style = groups, style
        self.dynamic_scope = bool(dynamic_scope)
        conv = conv_nd(self.spatial_dims)
        if style == "lp":  # every sub-position's offsets from the input point
            conv_in, offset_channels = self.in_channels, self.spatial_dims * groups * self.scale_product
        else:  # offsets predicted at the output resolution from the pixel-shuffled input
            conv_in, offset_channels = self.in_channels // self.scale_product, self.spatial_dims * groups
        self.offset = conv(conv_in, offset_channels, kernel_size=1)
        self.scope = conv(conv_in, offset_channels, kernel_size=1) if self.dynamic_scope else None
        self.proj = (
            conv(self.in_channels, self.out_channels, kernel_size=1) if self.out_channels != self.in_channels else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.offset.weight, std=0.001)
        nn.init.zeros_(self.offset.bias)
        if self.scope is not None:
            nn.init.zeros_(self.scope.weight)
            nn.init.zeros_(self.scope.bias)
        if self.proj is not None:
            self.proj.reset_parameters()

    def _offsets(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, n * groups, *S_out)`` offsets in input pixels (axis-major, first spatial axis first)."""
        source = x if self.style == "lp" else pixel_shuffle_nd(x, self.scale)
        offset = self.offset(source)
        if self.scope is not None:
            offset = offset * (0.5 * torch.sigmoid(self.scope(source)))
        else:
            offset = offset * 0.25
        # lp: channels (axis, group, sub-position) -> (B, axis * group, *S_out)
        return pixel_shuffle_nd(offset, self.scale) if self.style == "lp" else offset

    def upsample(self, x: torch.Tensor) -> torch.Tensor:
        n, g = self.spatial_dims, self.groups
        b, c, *spatial = x.shape
        offset = self._offsets(x)
        out_spatial = offset.shape[2:]
        offset = offset.reshape(b, n, g, *out_spatial)
        coords = []
        for axis in range(n):
            size, r = spatial[axis], self.scale[axis]
            view = [1] * n
            view[axis] = out_spatial[axis]
            base = (torch.arange(out_spatial[axis], device=x.device, dtype=offset.dtype) * 2 + 1) / (r * size) - 1
            coords.append(offset[:, axis] * (2.0 / size) + base.view(1, 1, *view))
        # grid_sample wants (N, *S_out, n) with the last axis first (x, y[, z])
        grid = torch.stack(coords[::-1], dim=-1).reshape(b * g, *out_spatial, n)
        y = F.grid_sample(
            x.reshape(b * g, c // g, *spatial), grid, mode="bilinear", padding_mode="border", align_corners=False
        ).reshape(b, c, *out_spatial)
        return self.proj(y) if self.proj is not None else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, groups={self.groups}, dynamic_scope={self.dynamic_scope}, style={self.style!r}"
