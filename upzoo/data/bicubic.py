"""MATLAB's ``imresize`` (bicubic, antialiased when shrinking): the degradation super-resolution
papers train and test with (DIV2K's, Set5's and BasicSR's low-resolution images are made by it).

Each output sample is a weighted sum of input samples along one axis: the cubic kernel of Keys
with ``a = -0.5``, stretched by ``1 / scale`` when shrinking (the antialiasing), weights normalised
to sum to one, and the image extended at its edges by mirror symmetry (``x[-1] = x[0]``), repeated
periodically as MATLAB's ``[1:n, n:-1:1]`` where the kernel is wider than twice the image. Along
an axis this is a matrix, built once for a pair of lengths; the resize of an image is
``rows @ image @ cols.T``. PyTorch's ``interpolate(mode="bicubic", antialias=True)`` uses the same
kernel but renormalises the weights at the edges instead of mirroring, so the two agree inside the
image and differ in the outer two-to-eight pixels.
"""

from __future__ import annotations

import functools
import math

import torch

from upzoo.checks import check_finite, check_positive_int, check_sizes
from upzoo.errors import ConfigError, ShapeError

__all__ = ["resize_matrix", "imresize", "bicubic_downscale"]


def _cubic(x: torch.Tensor) -> torch.Tensor:
    ax = x.abs()
    near = (1.5 * ax**3 - 2.5 * ax**2 + 1) * (ax <= 1)
    far = (-0.5 * ax**3 + 2.5 * ax**2 - 4 * ax + 2) * ((ax > 1) & (ax <= 2))
    return near + far


@functools.lru_cache(maxsize=64)
def resize_matrix(in_length: int, out_length: int, scale: float) -> torch.Tensor:
    """The ``(out_length, in_length)`` float64 matrix of MATLAB's bicubic ``imresize`` along one
    axis at ``scale`` (output / input; below 1 the kernel is widened by ``1 / scale``).

    >>> resize_matrix(8, 4, 0.5).sum(1)
    tensor([1., 1., 1., 1.], dtype=torch.float64)
    """
    width = 4.0 / scale if scale < 1 else 4.0
    x = torch.arange(1, out_length + 1, dtype=torch.float64)
    centre = x / scale + 0.5 * (1 - 1 / scale)  # 1-based input coordinates of each output sample
    left = torch.floor(centre - width / 2)
    taps = math.ceil(width) + 2
    index = left[:, None] + torch.arange(taps, dtype=torch.float64)[None]
    distance = centre[:, None] - index
    weights = scale * _cubic(distance * scale) if scale < 1 else _cubic(distance)
    weights = weights / weights.sum(1, keepdim=True)
    # 0-based; mirrored periodically as MATLAB's [1:n, n:-1:1] (-1 -> 0, -2 -> 1, n -> n - 1, and a
    # kernel wider than twice the image wraps around again instead of stopping at the edge)
    period = 2 * in_length
    index = torch.remainder(index.long() - 1, period)
    index = torch.where(index >= in_length, period - 1 - index, index)
    matrix = torch.zeros(out_length, in_length, dtype=torch.float64)
    matrix.scatter_add_(1, index, weights)
    return matrix


def imresize(images: torch.Tensor, size: tuple[int, int], scale: float) -> torch.Tensor:
    """``(..., H, W)`` float images resized to ``size`` at ``scale`` (``size = ceil((H, W) * scale)``
    as MATLAB's), computed in float64 and returned in the input's dtype.

    Raises:
        ShapeError: not float images with two spatial axes, a size that is not two sizes, or a size
            that is not MATLAB's for this scale.
        ConfigError: a scale that is not a positive finite number, or NaN/inf pixels.
    """
    if not isinstance(images, torch.Tensor) or images.ndim < 2 or not images.is_floating_point():
        shown = f"{tuple(images.shape)} {images.dtype}" if isinstance(images, torch.Tensor) else type(images).__name__
        raise ShapeError(f"imresize: expected float images (..., H, W), got {shown}")
    size = check_sizes(size, "imresize size", count=2, error=ShapeError)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        raise ConfigError(f"imresize: scale must be a positive finite number, got {scale!r}")
    check_finite(images, "imresize: images")
    height, width = images.shape[-2:]
    expected = tuple(math.ceil(n * scale - 1e-9) for n in (height, width))  # MATLAB's size for this scale
    if size != expected:
        raise ShapeError(
            f"imresize: size {size} contradicts scale {scale:g} for a {height}x{width} image (MATLAB's size is "
            f"{expected}); give size={expected}, or the scale that makes {size}"
        )
    rows = resize_matrix(height, size[0], scale).to(images.device)
    cols = resize_matrix(width, size[1], scale).to(images.device)
    return (rows @ images.double() @ cols.T).to(images.dtype)


def bicubic_downscale(images: torch.Tensor, factor: int) -> torch.Tensor:
    """``(..., H, W)`` images whose sides are multiples of ``factor`` shrunk by it, as MATLAB's
    ``imresize(img, 1 / factor, 'bicubic')``.

    >>> bicubic_downscale(torch.ones(1, 3, 8, 12), 4).shape
    torch.Size([1, 3, 2, 3])

    Raises:
        ShapeError: a factor that is not a whole number >= 1, or a side that is not a multiple of it
            (crop it first).
    """
    factor = check_positive_int(factor, "bicubic downscale factor")
    if not isinstance(images, torch.Tensor) or images.ndim < 2:
        raise ShapeError(f"bicubic downscale: expected images (..., H, W), got {type(images).__name__}")
    height, width = images.shape[-2:]
    if height % factor or width % factor:
        raise ShapeError(
            f"bicubic downscale by {factor}: the image is {height}x{width}, not a multiple of {factor}; crop it first"
        )
    return imresize(images, (height // factor, width // factor), 1 / factor)
