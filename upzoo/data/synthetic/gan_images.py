"""The embedded image set for GANs: thousands of small street-scene images, generated once into
the cache. Each scene is drawn at 128x256, reduced to 64x128 (area averaging: anti-aliased, like a
downscaled photo) and cut into its left and right 64x64 halves; ``train/`` and ``val/`` (held-out
scenes, for the generative metrics) hold PNGs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from upzoo.data.cache import cached
from upzoo.data.synthetic.streets import street_scene

__all__ = ["ensure_synthetic_gan_images"]

GAN_IMAGE_SIZE = 64


def _halves(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    import cv2

    image, _ = street_scene(rng, 2 * GAN_IMAGE_SIZE, 4 * GAN_IMAGE_SIZE)
    small = cv2.resize(image, (2 * GAN_IMAGE_SIZE, GAN_IMAGE_SIZE), interpolation=cv2.INTER_AREA)
    return small[:, :GAN_IMAGE_SIZE], small[:, GAN_IMAGE_SIZE:]


def ensure_synthetic_gan_images(
    cache_dir: str | Path | None = None, *, train: int = 4096, val: int = 1000, seed: int = 0
) -> Path:
    """``train`` + ``val`` 64x64 RGB street-scene images (``ROOT/train/*.png``, ``ROOT/val/*.png``),
    generated once (about 30 s for the defaults); the validation images come from other scenes.

    >>> root = ensure_synthetic_gan_images(train=4, val=2)  # doctest: +SKIP
    """
    from upzoo.data.io import write_png

    params = {"train": train, "val": val, "size": GAN_IMAGE_SIZE, "seed": seed, "version": 1}

    def write(root: Path) -> None:
        for split, count, stream in (("train", train, 2), ("val", val, 3)):
            for i in range(0, count, 2):
                for half, image in enumerate(_halves(np.random.default_rng([seed, stream, i // 2]))):
                    if i + half < count:
                        write_png(root / split / f"scene_{i + half:06d}.png", image)

    return cached("gan-images-synthetic", params, cache_dir, write)
