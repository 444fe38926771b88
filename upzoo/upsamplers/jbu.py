"""JBU: FeatUp's stack of learned joint bilateral upsamplers (Fu et al., ICLR 2024, "FeatUp: A
Model-Agnostic Framework for Features at Any Resolution"), pure PyTorch (no compiled op), any
integer ratio, written from the paper's equations."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.checks import check_positive_int
from upzoo.registry import register_upsampler
from upzoo.upsamplers.image_guided import Band, ImageGuidedUpsampler, halo_rows, rows_with_halo

__all__ = ["JbuUpsampler", "stage_factors"]


def stage_factors(ratio: Sequence[int]) -> list[tuple[int, ...]]:
    """The per-stage factors of a per-axis ``ratio``: each axis's prime factors, smallest first, the
    axes zipped and padded with 1 (``(16, 14) -> [(2, 2), (2, 7), (2, 1), (2, 1)]``).

    >>> stage_factors((16, 16))
    [(2, 2), (2, 2), (2, 2), (2, 2)]
    """
    axes = []
    for r in ratio:
        primes, p = [], 2
        while r > 1:
            while r % p == 0:
                primes.append(p)
                r //= p
            p += 1
        axes.append(primes)
    stages = max((len(a) for a in axes), default=0)
    return [tuple(a[i] if i < len(a) else 1 for a in axes) for i in range(stages)]


@register_upsampler("jbu")
class JbuUpsampler(ImageGuidedUpsampler):
    """JBU: joint bilateral upsampling with a learned range kernel, stacked.

    ``x (B, C, h, w), guide (B, 3, h*s, w*s) -> (B, C_out, h*s, w*s)``. The ratio is reached in
    stages (:func:`stage_factors`: x16 in four x2 stages, x14 as x2 then x7); at a stage of output
    size ``S``, with ``G`` the guide average-pooled to ``S``, output pixel ``p`` is
    ``sum_q K(p, q) up(x)_q`` over the ``(2r+1)^2`` pixels ``q`` around ``p`` (the edge pixel
    repeated beyond the border), ``up`` bicubic. ``K`` is the spatial Gaussian
    ``exp(-|p - q|^2 / 2 sigma^2)`` (offsets in units of the radius, learned ``sigma``) times the range kernel
    ``softmax_q(t * <P(G_p), P(G_q)>)`` (``P`` a learned two-layer 1x1 MLP, learned temperature
    ``t``), normalised to sum 1, plus ``0.1 * M([K, G_p])`` (FeatUp's kernel fix-up, a 1x1 MLP) less
    its mean over the window, so that every stage's kernel still sums to 1. After the last stage,
    ``y + 0.1 * W y`` with ``W`` a learned 1x1 conv.

    One set of stage weights serves every stage (FeatUp learns one per x2 stage of a fixed x16
    stack): the block is ratio-agnostic, so the JAFAR objective can train it at x2/x4 for use at
    x14/x16. Shared stages are why the fix-up is centred (FeatUp's is not): trained at x2/x4 with an
    uncentred fix-up, the kernels learned to sum to 0.29, which four stages at x16 compound to 0.29^4
    (features 1/135 of their size, a flat map). FeatUp's ``AdaptiveConv`` CUDA op is the sum over the
    window, written here as ``(2r+1)^2`` shifted multiply-adds. Dropout is left out, and the border
    repeats the edge pixel where FeatUp reflects (reflection needs a stage larger than the radius;
    repetition takes any size).

    Args:
        radius: the window's radius ``r`` (3: a 7x7 window).
        key_dim: width of the range projection ``P`` (32).
        chunk: see :class:`~upzoo.upsamplers.image_guided.ImageGuidedUpsampler`.
        guide_channels: see :class:`~upzoo.upsamplers.image_guided.ImageGuidedUpsampler`.

    >>> up = JbuUpsampler(spatial_dims=2, in_channels=8, out_channels=8, scale=14)
    >>> up(torch.rand(1, 8, 2, 3), torch.rand(1, 3, 28, 42)).shape
    torch.Size([1, 8, 28, 42])
    """

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        guide_channels: int = 3,
        radius: int = 3,
        key_dim: int = 32,
        chunk: int | None = None,
    ) -> None:
        super().__init__(
            spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale,
            guide_channels=guide_channels, chunk=chunk,
        )  # fmt: skip
        self.radius = check_positive_int(radius, "radius")
        key, taps, g = check_positive_int(key_dim, "key_dim"), (2 * self.radius + 1) ** 2, self.guide_channels
        self.range_proj = nn.Sequential(nn.Conv2d(g, key, 1), nn.GELU(), nn.Conv2d(key, key, 1))
        self.range_temperature = nn.Parameter(torch.tensor(0.0))  # log of t
        self.sigma_spatial = nn.Parameter(torch.tensor(1.0))
        self.kernel_fixup = nn.Sequential(nn.Conv2d(g + taps, taps, 1), nn.GELU(), nn.Conv2d(taps, taps, 1))
        self.residual = nn.Conv2d(self.in_channels, self.in_channels, 1)
        r = self.radius
        distance = torch.tensor([(i - r) ** 2 + (j - r) ** 2 for i, j in self.offsets()], dtype=torch.float32)
        self.register_buffer("distance", distance / r**2, persistent=False)  # squared, in units of the radius

    def offsets(self) -> list[tuple[int, int]]:
        d = 2 * self.radius + 1
        return [(i, j) for i in range(d) for j in range(d)]

    def kernel(self, guide: torch.Tensor, band: Band) -> torch.Tensor:
        """``(B, (2r+1)^2, rows, W)``: the combined kernel of a band of the stage's output rows."""
        r = self.radius
        keys = self.range_proj(F.pad(rows_with_halo(guide, band, r, "replicate"), (r, r, 0, 0), mode="replicate"))
        centre = keys[:, :, r:-r, r:-r]
        height, width = centre.shape[-2:]
        windows = [keys[:, :, i : i + height, j : j + width] for i, j in self.offsets()]
        scores = torch.stack([(window * centre).sum(1) for window in windows], dim=1)
        temperature = self.range_temperature.exp().clamp(1e-4, 1e4)
        spatial = torch.exp(-self.distance.to(guide.dtype) / (2 * self.sigma_spatial**2))
        combined = (scores * temperature).softmax(dim=1) * spatial[:, None, None]
        combined = combined / combined.sum(1, keepdim=True).clamp_min(1e-7)
        guide_rows = guide if band is None else guide[..., band[0] : band[1], :]
        fixup = self.kernel_fixup(torch.cat([combined, guide_rows], dim=1))
        return combined + 0.1 * (fixup - fixup.mean(1, keepdim=True))  # still sums to 1

    def bicubic_rows(self, x: torch.Tensor, factor: tuple[int, int], band: Band) -> torch.Tensor:
        """Rows ``[start - r, stop + r)`` of ``x`` bicubic-upsampled by ``factor``, the edge repeated
        beyond the border, from the source rows they depend on (with a margin, so equal to the whole)."""
        r, height = self.radius, x.shape[-2] * factor[0]
        if band is None:
            up = F.interpolate(x, scale_factor=factor, mode="bicubic", align_corners=False)
            return F.pad(up, (r, r, r, r), mode="replicate")
        top, bottom, _, _ = halo_rows(band, r, height)
        first, last = max(top // factor[0] - 2, 0), min((bottom - 1) // factor[0] + 3, x.shape[-2])
        up = F.interpolate(x[..., first:last, :], scale_factor=factor, mode="bicubic", align_corners=False)
        wanted = torch.arange(band[0] - r, band[1] + r, device=x.device)
        wanted = wanted.clamp(0, height - 1) - first * factor[0]
        return F.pad(up.index_select(-2, wanted), (r, r, 0, 0), mode="replicate")

    def stage(self, x: torch.Tensor, guide: torch.Tensor, factor: tuple[int, int], last: bool = False) -> torch.Tensor:
        """One bilateral stage: ``x`` upsampled by ``factor`` under ``guide`` (at the stage's output
        size); the ``last`` adds the residual ``0.1 * W y`` band by band (a 1x1 conv: the same)."""

        def rows_of(band: Band) -> torch.Tensor:
            kernel, source = self.kernel(guide, band), self.bicubic_rows(x, factor, band)
            height, width = kernel.shape[-2:]
            out = torch.zeros(x.shape[0], x.shape[1], height, width, device=x.device, dtype=x.dtype)
            for t, (i, j) in enumerate(self.offsets()):  # in place: one pass over the output per offset
                out.addcmul_(kernel[:, t : t + 1], source[:, :, i : i + height, j : j + width])
            return out + 0.1 * self.residual(out) if last else out

        return self.in_bands(guide.shape[-2], rows_of)

    def lift(self, x: torch.Tensor, guide: torch.Tensor, ratio: tuple[int, int]) -> torch.Tensor:
        factors = stage_factors(ratio)
        remaining = [math.prod([f[a] for f in factors]) for a in range(2)]
        for factor in factors:
            remaining = [remaining[a] // factor[a] for a in range(2)]
            stage_guide = guide if max(remaining) == 1 else F.avg_pool2d(guide, remaining, remaining)
            x = self.stage(x, stage_guide, factor, last=max(remaining) == 1)
        return x

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, radius={self.radius}"
