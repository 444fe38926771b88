"""Parameter-free resize by an integer per-axis scale (nearest, linear, cubic, Fourier)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F

from upzoo.errors import ConfigError
from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import Upsampler
from upzoo.upsamplers.fourier import fourier_resample

__all__ = ["InterpolateUpsampler", "InterpMode", "check_interp_mode", "resize"]

InterpMode = Literal["nearest", "nearest-exact", "bilinear", "bicubic", "trilinear", "fourier"]
_MODES_BY_DIMS: dict[int, tuple[str, ...]] = {
    2: ("nearest", "nearest-exact", "bilinear", "bicubic", "fourier"),
    3: ("nearest", "nearest-exact", "trilinear", "fourier"),
}
_SMOOTH = ("bilinear", "bicubic", "trilinear")


def check_interp_mode(mode: str, spatial_dims: int, align_corners: bool | None) -> None:
    """Raise ``ConfigError`` unless ``mode`` is a valid resize mode for ``spatial_dims`` and
    ``align_corners`` is only set for the smooth modes (as :func:`torch.nn.functional.interpolate`)."""
    modes = _MODES_BY_DIMS[spatial_dims]
    if mode not in modes:
        raise ConfigError(f"mode for {spatial_dims}D must be one of {', '.join(modes)}, got {mode!r}")
    if align_corners is not None and mode not in _SMOOTH:
        raise ConfigError(f"align_corners applies to {'/'.join(_SMOOTH)} only, not mode={mode!r}; leave it None")


def resize(x: torch.Tensor, scale: tuple[int, ...], mode: str, align_corners: bool | None) -> torch.Tensor:
    """``x`` resized by ``scale``: :func:`torch.nn.functional.interpolate`, or for ``fourier``
    :func:`~upzoo.upsamplers.fourier.fourier_resample` (zero-padding the spectrum)."""
    if mode == "fourier":
        return fourier_resample(x, scale)
    return F.interpolate(x, scale_factor=scale, mode=mode, align_corners=align_corners)


@register_upsampler("interpolate")
class InterpolateUpsampler(Upsampler):
    """Parameter-free resize (nearest, bilinear/bicubic in 2D, trilinear in 3D, or Fourier: the
    spectrum zero-padded, :func:`~upzoo.upsamplers.fourier.fourier_resample`); keeps the channels.

    ``(B, C, *S) -> (B, C, *S * scale)``; ``out_channels`` must equal ``in_channels``. This is the
    upsampling of segmentation-models-pytorch's U-Net decoder.

    Args:
        mode: ``nearest``, ``nearest-exact``, ``bilinear``/``bicubic`` (2D), ``trilinear`` (3D) or
            ``fourier`` (periodic sinc interpolation, equal to :func:`scipy.signal.resample` per axis).
        align_corners: as in :func:`torch.nn.functional.interpolate`, smooth modes only.
    """

    keeps_channels = True

    def __init__(
        self,
        *,
        spatial_dims: int,
        in_channels: int,
        out_channels: int,
        scale: int | Sequence[int],
        mode: InterpMode = "nearest",
        align_corners: bool | None = None,
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale)
        check_interp_mode(mode, self.spatial_dims, align_corners)
        self.mode = mode
        self.align_corners = align_corners

    def upsample(self, x: torch.Tensor) -> torch.Tensor:
        return resize(x, self.scale, self.mode, self.align_corners)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode!r}"
