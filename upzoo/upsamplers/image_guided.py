"""The common ground of the image-guided feature upsamplers (JBU, JAFAR, LoftUp, AnyUp): the image
is the guide, any integer ratio per axis, and ``chunk``, which computes the output in bands of rows
(the queries in tiles) so that memory is bounded and the result equals the whole computation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from upzoo.checks import check_finite, check_positive_int
from upzoo.errors import ConfigError, ShapeError
from upzoo.layers import to_ntuple
from upzoo.upsamplers.base import Upsampler

__all__ = [
    "ImageGuidedUpsampler", "PointwiseEncoder", "ChannelNorm", "rows_with_halo", "halo_rows", "pixel_centres", "Band",
    "check_feature_inputs",
]  # fmt: skip

#: Output rows ``[start, stop)`` of a band, or ``None`` for the whole image (the traced path).
Band = tuple[int, int] | None


def pixel_centres(start: int | torch.SymInt, stop: int | torch.SymInt, total: int | torch.SymInt,
                  like: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``(stop - start,)`` pixel centres in ``[0, 1]``: ``(i + 0.5) / total`` for ``i`` in
    ``[start, stop)`` — the frame in which a high-resolution query and a low-resolution key of the
    same image share coordinates. Always float32 or wider, whatever ``like``'s dtype: in bf16 the
    448 rows of a 448-pixel image fall on 288 distinct values (windows and rotations move)."""
    dtype = torch.promote_types(like.dtype, torch.float32)
    return (torch.arange(start, stop, device=like.device, dtype=dtype) + 0.5) / total


#: The largest |value| a guide may hold: an image in [0, 1], in [-1, 1] or normalised by any backbone's
#: mean and std stays far below it; 0-255 pixels do not.
GUIDE_LIMIT = 20.0


def check_feature_inputs(x: torch.Tensor, guide: torch.Tensor, owner: str) -> None:
    """Features and guide as the blocks compute with them: floats, finite, a guide within
    :data:`GUIDE_LIMIT` (not 0-255 pixels), and one dtype outside autocast (a float16 guide beside
    float32 features would otherwise come back float32, silently).
    Skipped while compiling or exporting, whose graphs carry no value checks, and on the meta device.

    Raises:
        ConfigError: integer tensors, NaN or inf, a 0-255 guide, or two dtypes outside autocast, naming
            the fix.
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or x.is_meta or guide.is_meta:
        return  # meta tensors (memory estimates) hold no values
    for name, value in (("features", x), ("guide", guide)):
        if not value.is_floating_point():
            raise ConfigError(f"{owner}: the {name} must be floats, got {value.dtype}; convert with .float()")
        check_finite(value, f"{owner}: the {name}")
    peak = float(guide.detach().abs().amax()) if guide.numel() else 0.0
    if peak > GUIDE_LIMIT:
        raise ConfigError(
            f"{owner}: the guide reaches |{peak:.4g}|, beyond any normalised image (|values| <= {GUIDE_LIMIT:g}); "
            f"the guide is the image as the backbone sees it: divide 0-255 pixels by 255, then normalise as it does"
        )
    if x.dtype != guide.dtype and not torch.is_autocast_enabled(x.device.type):
        raise ConfigError(
            f"{owner}: the features are {x.dtype} and the guide {guide.dtype}; give both one dtype "
            f"(e.g. guide.to(features.dtype)), or run under torch.autocast"
        )


def halo_rows(band: Band, halo: int, height: int | torch.SymInt) -> tuple:
    """``(top, bottom, pad_top, pad_bottom)``: the image rows ``[top, bottom)`` that a band with
    ``halo`` rows each side reads, and how many rows outside the image pad it on each side."""
    if band is None:
        return 0, height, halo, halo
    start, stop = band
    top, bottom = max(start - halo, 0), min(stop + halo, height)
    return top, bottom, halo - (start - top), halo - (bottom - stop)


def rows_with_halo(t: torch.Tensor, band: Band, halo: int, mode: str = "constant") -> torch.Tensor:
    """Rows ``[start - halo, stop + halo)`` of ``t (..., H, W)``; rows outside the image are padded
    (``mode`` of :func:`torch.nn.functional.pad`: zeros, or ``reflect``) exactly as padding the
    whole image would, so a convolution of the band equals the band of the convolution."""
    top, bottom, pad_top, pad_bottom = halo_rows(band, halo, t.shape[-2])
    rows = t if band is None else t[..., top:bottom, :]
    return F.pad(rows, (0, 0, pad_top, pad_bottom), mode=mode) if halo else rows


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of ``(B, C, H, W)``, per pixel (so that tiles are independent)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.movedim(1, -1)).movedim(-1, 1)


class PointwiseEncoder(nn.Module):
    """``(..., C_in) -> (..., width)`` on channels-last pixels: a linear layer and ``blocks``
    residual blocks of (LayerNorm, SiLU, linear) x 2 — JAFAR's and AnyUp's 1x1-conv encoders, with
    the per-pixel LayerNorm in place of their GroupNorm over the image (which would make a tile
    depend on the whole)."""

    def __init__(self, in_channels: int, width: int, blocks: int = 2) -> None:
        super().__init__()
        self.stem = nn.Linear(in_channels, width, bias=False)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(width), nn.SiLU(), nn.Linear(width, width),
                nn.LayerNorm(width), nn.SiLU(), nn.Linear(width, width),
            )
            for _ in range(blocks)
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return x


class ImageGuidedUpsampler(Upsampler):
    """Base of the image-guided blocks: ``x (B, C_in, h, w), guide (B, C_guide, h*s_h, w*s_w) ->
    (B, C_out, h*s_h, w*s_w)``; the guide is the image (``guide_channels=3``) at the output size.

    The output is computed by :meth:`lift` band by band (``chunk`` output rows at a time) or whole
    (``chunk=None``, the default, and the path ``torch.compile``, ``torch.export`` and ONNX take);
    both give the same values. :meth:`resample` runs the block at another integer ratio than its
    ``scale`` (the blocks are ratio-agnostic: the JAFAR objective trains them at x2/x4 for use at
    x14/x16). A 1x1 convolution maps ``in_channels`` to ``out_channels`` when they differ.
    """

    supported_spatial_dims = (2,)
    needs_guide = True
    guide_description = "the image itself, 3 channels in [0, 1], at the output resolution"
    feature_agnostic: ClassVar[bool] = False  # resample() takes features of any channel count

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        guide_channels: int = 3,
        chunk: int | None = None,
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
        self.guide_channels = check_positive_int(guide_channels, "guide_channels")
        self.chunk = None if chunk is None else check_positive_int(chunk, "chunk")
        same = self.out_channels == self.in_channels
        self.proj = None if same else nn.Conv2d(self.in_channels, self.out_channels, 1)

    def upsample(self, x: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
        check_feature_inputs(x, guide, type(self).__name__)
        return self._project(self.lift(x, guide, self.scale))

    def resample(self, x: torch.Tensor, guide: torch.Tensor, ratio: int | Sequence[int]) -> torch.Tensor:
        """The block at ``ratio`` (an int or one per axis) instead of its ``scale``: the guide is
        ``(B, guide_channels, h * ratio_h, w * ratio_w)``.

        Raises:
            ConfigError: a bad ratio. ShapeError: a guide that does not match ``x`` at this ratio.
        """
        ratio = to_ntuple(ratio, 2, "ratio")
        if x.dim() != 4:
            raise ShapeError(f"{type(self).__name__}.resample takes x (B, C, h, w), got shape {tuple(x.shape)}")
        b, _, h, w = x.shape
        expected = (b, self.guide_channels, h * ratio[0], w * ratio[1])
        any_width = self.feature_agnostic and self.proj is None  # AnyUp without a projection
        channels = "C" if any_width else self.in_channels
        wrong_channels = x.shape[1] != self.in_channels and not any_width
        if wrong_channels or tuple(guide.shape) != expected:
            raise ShapeError(
                f"{type(self).__name__}.resample at ratio {ratio}: expected x (B, {channels}, h, w) and a "
                f"guide {expected}, got x {tuple(x.shape)} and guide {tuple(guide.shape)}"
            )
        check_feature_inputs(x, guide, type(self).__name__)
        return self._project(self.lift(x, guide, ratio))

    def _project(self, y: torch.Tensor) -> torch.Tensor:
        return self.proj(y) if self.proj is not None else y

    def lift(self, x: torch.Tensor, guide: torch.Tensor, ratio: tuple[int, int]) -> torch.Tensor:
        """``(B, C_in, h, w) -> (B, C_in, h*r, w*r)`` (before the channel projection)."""
        raise NotImplementedError  # pragma: no cover

    def banded(self, height: int | torch.SymInt) -> bool:
        """Whether an output of ``height`` rows is computed in bands: ``chunk`` set and fewer rows than
        the output, eagerly (a traced graph, with symbolic sizes, takes the whole image)."""
        traced = torch.compiler.is_compiling() or not isinstance(height, int)
        return self.chunk is not None and not traced and height > self.chunk

    def in_bands(self, height: int | torch.SymInt, compute: Callable[[Band], torch.Tensor]) -> torch.Tensor:
        """``compute(band)`` for every band of ``chunk`` output rows, joined along the rows; the
        whole image at once when ``chunk`` is None or the rows are fewer. With gradients, each band
        is checkpointed (recomputed in the backward pass), so training memory is bounded by a band
        too, at the cost of a second forward pass."""
        if not self.banded(height):
            return compute(None)
        bands = [(s, min(s + self.chunk, height)) for s in range(0, height, self.chunk)]
        if torch.is_grad_enabled():  # training: each band recomputed in backward, so its memory is freed
            return torch.cat([checkpoint(compute, band, use_reentrant=False) for band in bands], dim=-2)
        first = compute(bands[0])  # inference: bands written into the output (no second copy from a cat)
        out = first.new_empty((*first.shape[:-2], height, first.shape[-1]))
        out[..., : bands[0][1], :] = first
        for start, stop in bands[1:]:
            out[..., start:stop, :] = compute((start, stop))
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, guide_channels={self.guide_channels}, chunk={self.chunk}"
