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

import cv2
import numpy as np
import torch

from upzoo.checks import check_bool, check_finite, check_positive_int
from upzoo.errors import ConfigError, ShapeError
from upzoo.metrics.results import ImageScores
from upzoo.metrics.streaming import StreamingMetric

__all__ = ["rgb_to_y", "psnr", "ssim", "psnr_ssim", "ImageQuality"]

_Y_WEIGHTS = (65.481, 128.553, 24.966)
_WINDOW, _SIGMA = 11, 1.5
_C1, _C2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2


def rgb_to_y(images: torch.Tensor) -> torch.Tensor:
    """``(B, 3, H, W)`` RGB in [0, 1] -> ``(B, 1, H, W)`` luma Y on the 0-255 scale (16..235),
    rounded as BasicSR's ``to_y_channel`` rounds it (float32 steps)."""
    x = images.float()
    y = x[:, 0].double().mul_(_Y_WEIGHTS[0])
    y.add_(x[:, 1].double(), alpha=_Y_WEIGHTS[1]).add_(x[:, 2].double(), alpha=_Y_WEIGHTS[2]).add_(16.0)
    return y.div_(255.0).float().mul_(255.0).double()[:, None]


def _prepared(output: torch.Tensor, target: torch.Tensor, crop_border: int, y_channel: bool) -> tuple:
    """Both images checked, cropped and on the 0-255 scale in float64."""
    for name, value in (("output", output), ("target", target)):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            shown = f"{value.dtype} tensor" if isinstance(value, torch.Tensor) else type(value).__name__
            raise ConfigError(f"image quality: {name} must be float images (B, C, H, W) in [0, 1], got a {shown}")
        if value.ndim != 4 or 0 in value.shape:
            raise ShapeError(
                f"image quality: {name} must be a non-empty batch of images (B, C, H, W), "
                f"got shape {tuple(value.shape)}"
            )
        check_finite(value, f"image quality {name}")
        low, high = float(value.min()), float(value.max())
        if low < 0 or high > 1:
            raise ConfigError(
                f"image quality: {name} must be in [0, 1], got values in [{low:.4g}, {high:.4g}]; divide 0-255 "
                f"images by 255, map [-1, 1] with (x + 1) / 2, and clamp a network's output to [0, 1]"
            )
    check_bool(y_channel, "y_channel")
    if output.shape != target.shape:
        raise ShapeError(f"image quality: output {tuple(output.shape)} and target {tuple(target.shape)} differ")
    crop = check_positive_int(crop_border, "crop_border", minimum=0)
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


def _psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mse = (a - b).pow_(2).mean(dim=(1, 2, 3))
    return torch.where(mse == 0, math.inf, 10.0 * torch.log10(255.0**2 / mse))


def psnr(output: torch.Tensor, target: torch.Tensor, *, crop_border: int = 0, y_channel: bool = False) -> torch.Tensor:
    """Per-image PSNR in dB (``inf`` for identical images) of ``(B, C, H, W)`` images in [0, 1].

    >>> x = torch.full((1, 3, 16, 16), 0.5)
    >>> round(float(psnr(x + 1 / 255, x)), 4)
    48.1308

    Raises:
        ShapeError: images that are not ``(B, C, H, W)`` of one shape, or too small for the crop.
        ConfigError: images that are not finite floats, or a bad ``crop_border``.
    """
    return _psnr(*_prepared(output, target, crop_border, y_channel))


def _gaussian_window() -> np.ndarray:
    offsets = np.arange(_WINDOW, dtype=np.float64) - _WINDOW // 2
    kernel = np.exp(-(offsets**2) / (2 * _SIGMA**2))
    return kernel / kernel.sum()


def _blurred(images: torch.Tensor, kernel: np.ndarray) -> torch.Tensor:
    """The valid part of a separable Gaussian filter of each ``(H, W)`` float64 image in ``images``
    ``(N, H, W)`` (OpenCV's separable filter, images split over the torch threads: PyTorch has no
    fast float64 convolution on the CPU)."""
    from concurrent.futures import ThreadPoolExecutor

    source = images.contiguous().numpy()
    out = np.empty_like(source)

    def blur(index: int) -> None:
        cv2.sepFilter2D(source[index], cv2.CV_64F, kernel, kernel, dst=out[index])

    workers = max(1, min(torch.get_num_threads(), len(source)))
    with ThreadPoolExecutor(workers) as pool:  # OpenCV releases the GIL
        list(pool.map(blur, range(len(source))))
    half = _WINDOW // 2
    return torch.from_numpy(out)[:, half:-half, half:-half]


def _ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    batch, channels = a.shape[:2]
    a, b = (x.reshape(-1, *x.shape[2:]).cpu() for x in (a, b))
    kernel = _gaussian_window()
    mu_a, mu_b = _blurred(a, kernel), _blurred(b, kernel)
    mu_ab = mu_a * mu_b
    mu_a = mu_a.square()
    mu_b = mu_b.square()
    var_sum = _blurred(a * a, kernel).add_(_blurred(b * b, kernel)).sub_(mu_a).sub_(mu_b).add_(_C2)
    cov = _blurred(a * b, kernel).sub_(mu_ab)
    index = mu_ab.mul_(2).add_(_C1).mul_(cov.mul_(2).add_(_C2)).div_(mu_a.add_(mu_b).add_(_C1).mul_(var_sum))
    return index.mean(dim=(1, 2)).view(batch, channels).mean(1)


def ssim(output: torch.Tensor, target: torch.Tensor, *, crop_border: int = 0, y_channel: bool = False) -> torch.Tensor:
    """Per-image SSIM (Wang et al. 2004) of ``(B, C, H, W)`` images in [0, 1], averaged over channels.

    >>> x = torch.rand(2, 3, 24, 24, generator=torch.Generator().manual_seed(0))
    >>> ssim(x, x).tolist()
    [1.0, 1.0]

    Raises:
        ShapeError: as :func:`psnr`.
    """
    return _ssim(*_prepared(output, target, crop_border, y_channel)).to(output.device)


def psnr_ssim(
    output: torch.Tensor, target: torch.Tensor, *, crop_border: int = 0, y_channel: bool = False
) -> ImageScores:
    """:func:`psnr` and :func:`ssim` at once, the images checked, cropped and converted once.

    Raises:
        ShapeError: as :func:`psnr`.
    """
    a, b = _prepared(output, target, crop_border, y_channel)
    return ImageScores(_psnr(a, b).to(output.device), _ssim(a, b).to(output.device))


class ImageQuality(StreamingMetric):
    """Streaming mean PSNR and SSIM over a test set (per-image values, float64 sums): ``update``
    with batches of outputs and targets (any sizes batch to batch), then ``compute``. Its defaults
    are :func:`psnr`'s and :func:`ssim`'s (``crop_border=0``, ``y_channel=False``: RGB); a paper's
    super-resolution figure is ``crop_border=scale, y_channel=True``, as the SR task measures it.

    >>> metric = ImageQuality(crop_border=2, y_channel=True)
    >>> x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    >>> metric.update(x, x); metric.compute()["ssim"]
    1.0

    ``sync_on_compute`` (default True): :meth:`compute` combines the DDP ranks first; False for a
    metric that one rank alone computes (see :class:`~upzoo.metrics.StreamingMetric`).
    """

    def __init__(self, *, crop_border: int = 0, y_channel: bool = False, sync_on_compute: bool = True) -> None:
        self.crop_border = check_positive_int(crop_border, "crop_border", minimum=0)
        self.y_channel = check_bool(y_channel, "y_channel")
        super().__init__(sync_on_compute=sync_on_compute)
        self.add_state("psnr_values", None, "cat")  # one float64 value per image
        self.add_state("ssim_values", None, "cat")

    @torch.no_grad()
    def update(self, output: torch.Tensor, target: torch.Tensor) -> None:
        values = psnr_ssim(output, target, crop_border=self.crop_border, y_channel=self.y_channel)
        self.psnr_values.append(values[0].double().cpu())
        self.ssim_values.append(values[1].double().cpu())

    def per_image(self) -> tuple[list[float], list[float]]:
        """The PSNR and the SSIM of every image so far, in the order they came."""
        return tuple(torch.cat(values).tolist() if values else [] for values in (self.psnr_values, self.ssim_values))

    def compute(self) -> dict[str, float]:
        """``psnr`` and ``ssim``: the means over the images so far (NaN before any)."""
        psnr_values = torch.cat(self.psnr_values).tolist() if self.psnr_values else []
        count = len(psnr_values)
        if not count:
            return {"psnr": math.nan, "ssim": math.nan, "images": 0}
        ssim_sum = math.fsum(torch.cat(self.ssim_values).tolist())
        return {"psnr": math.fsum(psnr_values) / count, "ssim": ssim_sum / count, "images": count}
