"""What an upsampler does to the frequency content of generated images: the azimuthally averaged
power spectrum of a set of images, the spectral error of a generated set against a real one, and
the power-law decay of the spectrum's high frequencies.

Up-convolutions leave their mark in the spectrum's high frequencies (Durall et al., "Watch your
up-convolution", CVPR 2020; Frank et al., ICML 2020; Dzanic et al., NeurIPS 2020; Chandrasegaran et
al., CVPR 2021: changing only the last upsampling layer changes the high-frequency decay).

Definitions (square images ``(N, C, N, N)``, values in [0, 1] or uint8 0..255, scaled to [0, 1]; images
that are not square are refused, since one set of rings cannot reach both axes' Nyquist frequency):

- Schwarz et al.'s definition (``utils/spectrum.py`` of autonomousvision/frequency_bias): each
  channel of each image is a 2D signal of its own; its DFT's power ``|F(u, v)|^2 / (H W)`` is laid
  on the centred grid of signed frequencies ``u, v`` (for even ``N`` the Nyquist row and column
  appear at both ends, ``-N/2`` and ``+N/2``, as the authors duplicate them) and averaged over rings
  of integer radius ``r = floor(sqrt(u^2 + v^2))`` (the corners reach ``r = floor(sqrt(2) * N / 2)``).
  The set's spectrum is the mean over its images and channels: each DFT in its input's precision
  (float32 for uint8 and float32 images), the sums in float64. The one difference from the authors:
  the power is divided by ``H W`` (they use the unnormalised DFT), so that white noise of variance
  ``s^2`` has the flat spectrum ``s^2``; every ratio (the spectral error) and the decay are the
  same. A pure checkerboard puts all its power in the corner ring.
- The spectral error (Schwarz et al., "On the Frequency Bias of Generative Models", NeurIPS 2021):
  ``e(r) = S_gen(r) / S_real(r) - 1`` per ring, and its summary, the mean ``|e(r)|`` over the upper
  half of the frequencies that both axes measure: the rings ``N / 4 < r <= N / 2`` (0.25 to 0.5
  cycles per pixel). The corner rings beyond Nyquist (``r > N / 2``, where only diagonal
  frequencies exist and a checkerboard puts its power) are summarised apart
  (:func:`corner_error`), so that their few, partial rings do not dominate the band's mean. A real
  set with no power at some ring (a constant image has none beyond ring 0) cannot be compared with
  and is refused.
- The high-frequency decay (after Dzanic et al. 2020): a least-squares fit of
  ``log10 S(r) = log10 a - b log10 r`` over the rings from 0.75 to 1.0 of the Nyquist radius
  (0.375 to 0.5 cycles per pixel; images of at least 8x8), of the spectrum normalised to unit total
  power; ``b`` is the decay (larger: faster fall-off), ``a`` the amplitude.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from upzoo.checks import check_positive_int
from upzoo.errors import ConfigError, ShapeError
from upzoo.metrics.results import SpectralError
from upzoo.metrics.streaming import StreamingMetric

__all__ = [
    "RadialSpectrum",
    "radial_power_spectrum",
    "spectral_error",
    "corner_error",
    "ring_frequencies",
    "spectral_decay",
    "SpectralDecay",
]


def _ring_index(height: int, width: int, device: torch.device) -> torch.Tensor:
    """Each rfft2 coefficient's ring: the floor of its frequency radius (Nyquist at ``N / 2``)."""
    u = torch.fft.fftfreq(height, 1 / height, device=device, dtype=torch.float64)
    v = torch.fft.rfftfreq(width, 1 / width, device=device, dtype=torch.float64)
    return torch.sqrt(u[:, None] ** 2 + v[None, :] ** 2).floor().long()


def _rfft_weights(height: int, width: int, device: torch.device) -> torch.Tensor:
    """How often each rfft2 coefficient stands on the authors' centred grid: columns ``0 < v < N/2``
    twice (``-v`` and ``+v``), the Nyquist row and column twice too (the grid holds them at both
    ends), the zero column once."""
    columns = torch.full((width // 2 + 1,), 2.0, dtype=torch.float64, device=device)
    columns[0] = 1.0
    rows = torch.ones(height, dtype=torch.float64, device=device)
    if height % 2 == 0:
        rows[height // 2] = 2.0
    return rows[:, None] * columns[None, :]


def as_unit_images(images: torch.Tensor, what: str = "images") -> torch.Tensor:
    """``(N, C, H, W)`` uint8 (0..255) or float in [0, 1] -> float in [0, 1].

    Raises:
        ShapeError: not a batch (N, C, H, W).
        ConfigError: another dtype, NaN/inf, or floats outside [0, 1].
    """
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or 0 in images.shape:
        shown = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ShapeError(f"{what}: expected a batch of images (N, C, H, W), got {shown}")
    if images.dtype == torch.uint8:
        return images.float() / 255.0
    if not images.is_floating_point():
        raise ConfigError(f"{what}: expected uint8 (0..255) or float images in [0, 1], got {images.dtype}")
    low, high = (float(v) for v in torch.aminmax(images))  # one pass; NaN and inf show in the extremes
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ConfigError(f"{what}: {int((~torch.isfinite(images)).sum())} values are NaN or infinite")
    if low < 0 or high > 1:
        raise ConfigError(
            f"{what}: float images must hold values in [0, 1], got {low:.4g}..{high:.4g} "
            f"(map a tanh generator's output with (x + 1) / 2)"
        )
    return images


def _finite_images(images: torch.Tensor) -> torch.Tensor:
    """``(N, C, H, W)`` finite floats, any range.

    Raises:
        ShapeError: not a non-empty batch (N, C, H, W).
        ConfigError: not a float tensor, or NaN/inf.
    """
    if not isinstance(images, torch.Tensor) or not images.is_floating_point():
        shown = f"{images.dtype} tensor" if isinstance(images, torch.Tensor) else type(images).__name__
        raise ConfigError(f"images: expected a float batch of images (N, C, H, W), got a {shown}")
    if images.ndim != 4 or 0 in images.shape:
        raise ShapeError(f"images: expected a float batch of images (N, C, H, W), got shape {tuple(images.shape)}")
    if not bool(torch.isfinite(images).all()):
        raise ConfigError(f"images: {int((~torch.isfinite(images)).sum())} values are NaN or infinite")
    return images


class RadialSpectrum(StreamingMetric):
    """The azimuthally averaged power spectrum of a set of images, accumulated batch by batch (states:
    the sum over images and channels of each ring's mean power, and the count of channel images;
    both summed across DDP ranks).

    >>> spectrum = RadialSpectrum()
    >>> spectrum.update(torch.rand(8, 3, 32, 32))
    >>> spectrum.compute().shape  # rings 0..floor(sqrt(2) * 16)
    (23,)

    Args:
        unit_range: images are uint8 or floats in [0, 1] (checked); ``False`` takes any finite
            floats, e.g. a generator's raw output in the regression testbed, whose spectrum is
            measured before any clamping (the power then is in the images' own units).
        sync_on_compute: whether :meth:`compute` combines the DDP ranks first (False for a metric
            that one rank alone computes; see :class:`~upzoo.metrics.StreamingMetric`).
    """

    def __init__(self, *, unit_range: bool = True, sync_on_compute: bool = True) -> None:
        super().__init__(sync_on_compute=sync_on_compute)
        self.unit_range = unit_range
        self.add_state("ring_power", None, "sum")  # (R,) float64, shaped by the first batch
        self.add_state("count", torch.zeros((), dtype=torch.int64), "sum")
        self._geometry: tuple[tuple[int, int], torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def reset(self) -> None:
        super().reset()
        self._geometry = None

    def _rings(self, size: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each rfft2 coefficient's ring, its weight (1 or 2: the half spectrum) and each ring's area.

        Raises:
            ShapeError: a size other than the earlier batches'.
        """
        if self._geometry is None:
            rings, weights = _ring_index(*size, device), _rfft_weights(*size, device)
            area = torch.zeros(int(rings.max()) + 1, dtype=torch.float64, device=device)
            area.index_add_(0, rings.flatten(), weights.flatten())
            self._geometry = (size, rings, weights, area)
        elif size != self._geometry[0]:
            raise ShapeError(f"all images of a spectrum need one size: {self._geometry[0]} so far, then {size}")
        return self._geometry[1:]

    def update(self, images: torch.Tensor) -> None:
        """Add a batch ``(N, C, H, W)`` of square images (every batch of one size).

        Raises:
            ShapeError: images that are not square, or not of the size of the earlier batches.
        """
        x = as_unit_images(images) if self.unit_range else _finite_images(images)
        # float64 input stays float64 (the sums are float64 anyway); half precision has no CPU FFT
        x = (x.float() if x.dtype in (torch.float16, torch.bfloat16) else x).flatten(0, 1)  # a channel an image
        size = tuple(x.shape[-2:])
        if size[0] != size[1]:
            raise ShapeError(
                f"the radial spectrum is defined on square images (rings up to the one Nyquist radius of both "
                f"axes), got {size[0]}x{size[1]}: crop or resize the images to NxN first"
            )
        rings, weights, area = self._rings(size, x.device)
        spectrum = torch.fft.rfft2(x)
        power = (spectrum.real.square() + spectrum.imag.square()).sum(0, dtype=torch.float64) / (size[0] * size[1])
        summed = torch.zeros_like(area).index_add_(0, rings.flatten(), (power * weights).flatten()) / area
        self.ring_power = summed if self.ring_power is None else self.ring_power + summed
        self.count += x.shape[0]

    def compute(self) -> np.ndarray:
        """The mean power per ring, ``(R,)`` float64.

        Raises:
            ShapeError: before any image.
        """
        if self.ring_power is None:
            raise ShapeError("the spectrum has seen no images")
        return (self.ring_power / self.count).cpu().numpy()


def radial_power_spectrum(images: torch.Tensor, batch_size: int = 1024) -> np.ndarray:
    """The azimuthally averaged power spectrum ``(R,)`` of a set of images (see the module).

    Raises:
        ShapeError: not a batch of square images of one size.
        ConfigError: images of another dtype, NaN, or values outside [0, 1].
    """
    if not isinstance(images, torch.Tensor):
        raise ShapeError(f"images must be a tensor (N, C, H, W), got {type(images).__name__}")
    batch_size = check_positive_int(batch_size, "batch_size")
    spectrum = RadialSpectrum(sync_on_compute=False)
    for start in range(0, len(images), batch_size):
        spectrum.update(images[start : start + batch_size])
    return spectrum.compute()


def _nyquist(spectrum: np.ndarray) -> int:
    """The Nyquist radius (``N / 2``) of the square ``N x N`` images whose spectrum has these rings
    (the last ring is ``floor(sqrt(2) * N / 2)``, which only ``N / 2`` gives)."""
    return math.ceil((len(spectrum) - 1) / math.sqrt(2) - 1e-9)


def ring_frequencies(spectrum: np.ndarray) -> np.ndarray:
    """Each ring's radial frequency in cycles per pixel (``r / N``, the ring's inner edge: ring ``r``
    holds the radii in ``[r, r + 1)``; 0.5 is Nyquist) for a radial spectrum of ``N x N`` images.

    >>> ring_frequencies(np.zeros(23))[[0, 16, 22]].tolist()  # 32x32 images
    [0.0, 0.5, 0.6875]
    """
    return np.arange(len(spectrum)) / (2 * _nyquist(spectrum))


def _as_spectrum(spectrum: np.ndarray, what: str) -> np.ndarray:
    """A radial spectrum: 1D, finite, non-negative, of images of at least 2x2.

    Raises:
        ShapeError: not one axis of at least two rings.
        ConfigError: not real, finite numbers >= 0.
    """
    if np.iscomplexobj(spectrum):
        raise ConfigError(f"{what}: a power spectrum holds real numbers, got {np.asarray(spectrum).dtype}")
    try:
        spectrum = np.asarray(spectrum, np.float64)
    except (TypeError, ValueError):
        shown = type(spectrum).__name__
        raise ConfigError(f"{what}: expected a radial spectrum (R,) of numbers, got {shown}") from None
    if spectrum.ndim != 1 or len(spectrum) < 2:
        raise ShapeError(
            f"{what}: expected a radial spectrum (R,) of R >= 2 rings (images of at least 2x2), got shape "
            f"{spectrum.shape}"
        )
    if not np.isfinite(spectrum).all() or (spectrum < 0).any():
        raise ConfigError(f"{what}: a power spectrum holds finite values >= 0, got {spectrum.min()}..{spectrum.max()}")
    return spectrum


def empty_rings(spectrum: np.ndarray) -> np.ndarray:
    """The rings (beyond ring 0) of a radial spectrum that hold no power: below 1e-12 of the total,
    float32's rounding of the DFT. A real set with one defines no spectral error there."""
    spectrum = _as_spectrum(spectrum, "spectrum")
    return np.flatnonzero(spectrum[1:] <= 1e-12 * spectrum.sum()) + 1


def _relative_error(generated: np.ndarray, real: np.ndarray) -> np.ndarray:
    generated = _as_spectrum(generated, "generated spectrum")
    real = _as_spectrum(real, "real spectrum")
    if generated.shape != real.shape:
        raise ShapeError(
            f"spectra of {len(generated)} and {len(real)} rings: the generated and real images differ in size"
        )
    empty = empty_rings(real)
    if empty.size:
        raise ConfigError(
            f"the real set has no power at ring {int(empty[0])} (of {len(real) - 1}; {empty.size} ring(s) empty): "
            f"a constant or band-limited real set cannot define a spectral error; use other real images"
        )
    return generated / real - 1


def spectral_error(generated: np.ndarray, real: np.ndarray) -> SpectralError:
    """``e(r) = S_gen(r) / S_real(r) - 1`` per ring, and the mean ``|e|`` over the upper half of the
    frequencies both axes measure, ``N / 4 < r <= N / 2`` (Schwarz et al. 2021; see the module).

    Raises:
        ShapeError: spectra of different lengths (images of different sizes), or not spectra.
        ConfigError: a real spectrum with an empty ring, or values that are no power.
    """
    error = _relative_error(generated, real)
    radii, nyquist = np.arange(len(error)), _nyquist(error)
    upper = (radii > nyquist / 2) & (radii <= nyquist)
    return SpectralError(error, float(np.abs(error[upper]).mean()))


def image_spectral_error(generated: torch.Tensor, real: torch.Tensor) -> SpectralError:
    """:func:`spectral_error` of two sets of images ``(N, C, H, W)`` (square, uint8 or float in
    [0, 1]): their radial power spectra (:func:`radial_power_spectrum`) compared ring by ring.
    ``spectral_error`` itself takes the spectra.

    >>> noise = torch.rand(8, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    >>> image_spectral_error(noise, noise)[1]
    0.0

    Raises:
        ShapeError: images that are not square batches of one size, or as :func:`spectral_error`.
        ConfigError: images of another dtype, NaN, values outside [0, 1], or as :func:`spectral_error`.
    """
    generated, real = as_unit_images(generated, "generated images"), as_unit_images(real, "real images")
    return spectral_error(radial_power_spectrum(generated), radial_power_spectrum(real))


def corner_error(generated: np.ndarray, real: np.ndarray) -> float:
    """The mean ``|e(r)|`` over the corner rings beyond Nyquist, ``r > N / 2`` (diagonal
    frequencies only: where a checkerboard's power lies).

    Raises:
        ShapeError, ConfigError: as :func:`spectral_error`.
    """
    error = _relative_error(generated, real)
    return float(np.abs(error[np.arange(len(error)) > _nyquist(error)]).mean())


@dataclass(frozen=True)
class SpectralDecay:
    """``log10 S(r) = log10(amplitude) - decay * log10(r)`` over the upper quarter to Nyquist."""

    decay: float
    amplitude: float


def spectral_decay(spectrum: np.ndarray) -> SpectralDecay:
    """The power-law fit of the spectrum's high frequencies (see the module).

    Raises:
        ShapeError: not a spectrum, or fewer than two rings with power in the fitted band (images
            smaller than 8x8, or constant ones).
    """
    spectrum = _as_spectrum(spectrum, "spectrum")
    normalised = spectrum / max(spectrum.sum(), np.finfo(np.float64).tiny)
    radii = np.arange(len(spectrum))
    nyquist = _nyquist(spectrum)
    band = (radii >= 0.75 * nyquist) & (radii <= nyquist) & (normalised > 0)
    if band.sum() < 2:
        raise ShapeError(
            f"the spectral decay fits the rings from 0.75 to 1.0 of the Nyquist radius ({nyquist}) that hold "
            f"power, and needs two; got {int(band.sum())} (images of at least 8x8 that are not constant)"
        )
    slope, intercept = np.polyfit(np.log10(radii[band]), np.log10(normalised[band]), 1)
    return SpectralDecay(decay=float(-slope), amplitude=float(10**intercept))
