"""PSNR and SSIM with the super-resolution field's conventions (BasicSR's ``calculate_psnr`` and
``calculate_ssim``, the numbers papers print): images on the 0-255 scale, ``crop_border`` pixels
cut from every edge (the scale, by convention), optionally only the Y channel of ITU-R BT.601
YCbCr (``16 + 65.481 R + 128.553 G + 24.966 B`` for R, G, B in [0, 1], with BasicSR's float32
rounding, so that the figures agree to 1e-6); SSIM with an 11x11 Gaussian window of sigma 1.5 over
the valid region, averaged over channels. Both are per image; a test set's figure is the mean over
its images (:class:`ImageQuality` streams it with float64 sums).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from upzoo.checks import check_finite, check_positive_int
from upzoo.errors import ShapeError

__all__ = ["rgb_to_y", "psnr", "ssim", "ImageQuality"]

_Y_WEIGHTS = (65.481, 128.553, 24.966)
_WINDOW, _SIGMA = 11, 1.5


def rgb_to_y(images: torch.Tensor) -> torch.Tensor:
    """``(B, 3, H, W)`` RGB in [0, 1] -> ``(B, 1, H, W)`` luma Y on the 0-255 scale (16..235),
    rounded as BasicSR's ``to_y_channel`` rounds it (float32 steps)."""
    x = images.float().double()
    weights = torch.tensor(_Y_WEIGHTS, dtype=torch.float64, device=images.device)
    y = torch.einsum("bchw,c->bhw", x, weights) + 16.0
    return ((y / 255.0).float() * 255.0).double()[:, None]


def _prepared(output: torch.Tensor, target: torch.Tensor, crop_border: int, y_channel: bool) -> tuple:
    """Both images checked, cropped and on the 0-255 scale in float64."""
    for name, value in (("output", output), ("target", target)):
        if not isinstance(value, torch.Tensor) or value.ndim != 4 or not value.is_floating_point():
            shown = f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise ShapeError(f"image quality: {name} must be float images (B, C, H, W) in [0, 1], got {shown}")
        check_finite(value, f"image quality {name}", error=ShapeError)
    if output.shape != target.shape:
        raise ShapeError(f"image quality: output {tuple(output.shape)} and target {tuple(target.shape)} differ")
    crop = check_positive_int(crop_border, "crop_border", minimum=0, error=ShapeError)
    height, width = output.shape[2:]
    if min(height, width) - 2 * crop < _WINDOW:
        raise ShapeError(
            f"image quality: images of {height}x{width} with crop_border {crop} leave less than {_WINDOW} pixels "
            f"a side (SSIM's window); use larger images or a smaller crop_border"
        )
    if y_channel and output.shape[1] not in (1, 3):
        raise ShapeError(f"image quality: the Y channel needs RGB or gray images, got {output.shape[1]} channels")
    region = (slice(None), slice(None), slice(crop, height - crop), slice(crop, width - crop))
    output, target = output[region], target[region]
    if y_channel and output.shape[1] == 3:
        return rgb_to_y(output), rgb_to_y(target)
    return output.double() * 255.0, target.double() * 255.0


def psnr(output: torch.Tensor, target: torch.Tensor, *, crop_border: int = 0, y_channel: bool = False) -> torch.Tensor:
    """Per-image PSNR in dB (``inf`` for identical images) of ``(B, C, H, W)`` images in [0, 1].

    >>> x = torch.full((1, 3, 16, 16), 0.5)
    >>> round(float(psnr(x + 1 / 255, x)), 4)
    48.1308

    Raises:
        ShapeError: images that are not float ``(B, C, H, W)`` of one shape, or too small for the crop.
    """
    a, b = _prepared(output, target, crop_border, y_channel)
    mse = (a - b).pow(2).mean(dim=(1, 2, 3))
    return torch.where(mse == 0, math.inf, 10.0 * torch.log10(255.0**2 / mse))


def _gaussian_window(device: torch.device) -> torch.Tensor:
    offsets = torch.arange(_WINDOW, dtype=torch.float64, device=device) - _WINDOW // 2
    kernel = torch.exp(-(offsets**2) / (2 * _SIGMA**2))
    return kernel / kernel.sum()


def _blur(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """The valid part of a separable Gaussian filter of ``(N, 1, H, W)``."""
    x = F.conv2d(x, kernel.view(1, 1, -1, 1))
    return F.conv2d(x, kernel.view(1, 1, 1, -1))


def ssim(output: torch.Tensor, target: torch.Tensor, *, crop_border: int = 0, y_channel: bool = False) -> torch.Tensor:
    """Per-image SSIM (Wang et al. 2004) of ``(B, C, H, W)`` images in [0, 1], averaged over channels.

    >>> x = torch.rand(2, 3, 24, 24, generator=torch.Generator().manual_seed(0))
    >>> ssim(x, x).tolist()
    [1.0, 1.0]

    Raises:
        ShapeError: as :func:`psnr`.
    """
    a, b = _prepared(output, target, crop_border, y_channel)
    batch, channels = a.shape[:2]
    a, b = a.reshape(-1, 1, *a.shape[2:]), b.reshape(-1, 1, *b.shape[2:])
    kernel = _gaussian_window(a.device)
    mu_a, mu_b = _blur(a, kernel), _blur(b, kernel)
    var_a = _blur(a * a, kernel) - mu_a**2
    var_b = _blur(b * b, kernel) - mu_b**2
    cov = _blur(a * b, kernel) - mu_a * mu_b
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    index = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return index.mean(dim=(1, 2, 3)).view(batch, channels).mean(1)


class ImageQuality:
    """Streaming mean PSNR and SSIM over a test set (per-image values, float64 sums): ``update``
    with batches of outputs and targets (any sizes batch to batch), then ``compute``.

    >>> metric = ImageQuality(crop_border=2, y_channel=True)
    >>> x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    >>> metric.update(x, x); metric.compute()["ssim"]
    1.0
    """

    def __init__(self, *, crop_border: int = 0, y_channel: bool = True) -> None:
        self.crop_border = check_positive_int(crop_border, "crop_border", minimum=0)
        self.y_channel = bool(y_channel)
        self.reset()

    def reset(self) -> None:
        self.psnr_values: list[float] = []
        self.ssim_values: list[float] = []

    @torch.no_grad()
    def update(self, output: torch.Tensor, target: torch.Tensor) -> None:
        options = {"crop_border": self.crop_border, "y_channel": self.y_channel}
        self.psnr_values += psnr(output, target, **options).tolist()
        self.ssim_values += ssim(output, target, **options).tolist()

    def compute(self) -> dict[str, float]:
        """``psnr`` and ``ssim``: the means over the images so far (NaN before any)."""
        count = len(self.psnr_values)
        if not count:
            return {"psnr": math.nan, "ssim": math.nan, "images": 0}
        psnr_sum = math.fsum(self.psnr_values)
        return {"psnr": psnr_sum / count, "ssim": math.fsum(self.ssim_values) / count, "images": count}
