"""Schwarz et al.'s *toyset* (NeurIPS 2021, "On the Frequency Bias of Generative Models"): RGB
images whose spectra are Gaussian rings, one low and one high, with random phases — a target whose
every frequency is known, for the generator testbed. Written here from the paper's definition:

- Each ring is drawn at twice the resolution (``M = 2N``, to avoid discretising it coarsely) as a
  Fourier *magnitude* ``|F(u, v)| = g(r; f, 1 / (N + 1))`` with ``g`` a normal density and ``r``
  the frequency normalised per axis (1 at the axis' Nyquist frequency, ``sqrt(2)`` in the corner),
  scaled so that the image's ``ortho``-normalised energy is about ``M^2 / 3``.
- The ring's centre ``f = sqrt(2) * U(f_min, f_max)``: ``(0.05, 0.15)`` for the low ring (0.07 to
  0.21 of Nyquist) and ``(0.75, 0.85)`` for the high one (1.06 to 1.20 of Nyquist: beyond the axes'
  Nyquist frequency, in the corners of the spectrum, where only diagonal frequencies exist).
- Every channel gets uniform random phases (zero at the frequencies that must be real), the
  inverse real FFT (``ortho``) gives the image, the rings' images are averaged, mapped from
  [-1, 1] to 8 bits, and the centre ``N x N`` is cut out.

The random stream is NumPy's ``PCG64`` and the FFTs are float64, so every machine writes the same
bytes. Images are PNGs under ``ROOT/train/``, generated once into the cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from upzoo.data.cache import cached

__all__ = ["ensure_toyset", "toyset_image", "ring_magnitude", "TOYSET_RINGS"]

#: the rings' centre ranges, as fractions of the corner frequency sqrt(2) (the paper's defaults)
TOYSET_RINGS: tuple[tuple[float, float], ...] = ((0.05, 0.15), (0.75, 0.85))


def _normal(x: np.ndarray, mean: float, std: float) -> np.ndarray:
    return np.exp(-((x - mean) ** 2) / (2 * std**2)) / (math.sqrt(2 * math.pi) * std)


def ring_magnitude(size: int, frequency: float) -> np.ndarray:
    """The Fourier magnitude ``(size, size // 2 + 1)`` (``rfft2`` layout) of a ring at
    ``frequency`` (1: the axis' Nyquist frequency) on ``size x size`` images (``size`` even)."""
    half = size // 2
    radius = np.hypot(*np.meshgrid(np.linspace(0, 1, half), np.linspace(0, 1, half + 1), indexing="ij"))
    std = 1 / (half + 1)  # one frequency step
    total = 4 * _normal(radius, 1 / math.sqrt(2), std).sum()  # a ring in the middle of the spectrum
    quadrant = _normal(radius, frequency, std) / total * size**2 / 3
    return np.concatenate([quadrant, quadrant[::-1]])


def _ring_image(magnitude: np.ndarray, rng: np.random.Generator, channels: int) -> np.ndarray:
    phase = rng.uniform(0, 2 * math.pi, size=(channels, *magnitude.shape))
    half = magnitude.shape[0] // 2
    for row in (0, half):  # the frequencies whose coefficient is real: a phase of zero
        phase[:, row, 0] = phase[:, row, -1] = 0
    spectrum = magnitude * np.exp(1j * phase)
    size = magnitude.shape[0]
    return np.fft.irfft2(spectrum, s=(size, size), norm="ortho")


def toyset_image(
    rng: np.random.Generator, resolution: int, rings: Sequence[tuple[float, float]] = TOYSET_RINGS
) -> np.ndarray:
    """One toyset image, ``(resolution, resolution, 3)`` uint8 (``resolution`` even)."""
    size = 2 * resolution
    image = np.zeros((3, size, size))
    for low, high in rings:
        frequency = rng.uniform(low, high) * math.sqrt(2)
        image += _ring_image(ring_magnitude(size, frequency), rng, 3)
    image /= len(rings)
    pixels = np.clip(np.floor((image + 1) * 127.5), 0, 255).astype(np.uint8)
    start = (size - resolution) // 2
    return pixels[:, start : start + resolution, start : start + resolution].transpose(1, 2, 0)


def ensure_toyset(cache_dir: str | Path | None = None, *, count: int = 10, resolution: int = 64, seed: int = 0) -> Path:
    """The first ``count`` images of the seeded toyset at ``resolution`` (``ROOT/train/*.png``),
    generated once (the paper draws 100 and trains on the first 10).

    >>> root = ensure_toyset(count=10)  # doctest: +SKIP
    """
    from upzoo.data.io import write_png

    params = {"count": count, "resolution": resolution, "seed": seed, "rings": TOYSET_RINGS, "version": 1}

    def write(root: Path) -> None:
        rng = np.random.default_rng(seed)
        for i in range(count):
            write_png(root / "train" / f"toy_{i:04d}.png", toyset_image(rng, resolution))

    return cached("toyset", params, cache_dir, write)
