"""The generator testbed's data (Schwarz et al., NeurIPS 2021): a few images, each paired with a
fixed latent, that a generator learns to reproduce with an MSE loss. The embedded toyset
(:mod:`upzoo.data.synthetic.toyset`) or any folder of square images at the generator's resolution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from upzoo.data.images import ImageFolderDataset
from upzoo.data.io import read_image
from upzoo.errors import ConfigError, DataError

__all__ = ["RegressionImages", "testbed_images"]

#: the most images a testbed regresses (all are held in memory and generated at every evaluation)
MAX_TESTBED_IMAGES = 1000


class RegressionImages(Dataset):
    """``{"image": (3, R, R) in [-1, 1], "latent": (latent_dim,), "name": str}``: every image of
    ``files``, read once, each with its latent (drawn from N(0, 1) with ``seed``, in file order).

    Raises:
        DataError: an unreadable image, or one that is not ``resolution x resolution``, naming it.
    """

    def __init__(self, files: list[Path], resolution: int, latent_dim: int, seed: int) -> None:
        images = []
        for path in files:
            pixels = read_image(path)
            if pixels.shape[:2] != (resolution, resolution):
                raise DataError(
                    f"{path}: the testbed regresses {resolution}x{resolution} images (the generator's resolution), "
                    f"got {pixels.shape[0]}x{pixels.shape[1]}; resize the images or set model.resolution"
                )
            images.append(torch.from_numpy(pixels).permute(2, 0, 1).float() / 127.5 - 1)
        self.images = torch.stack(images)
        self.names = [path.name for path in files]
        self.latents = torch.randn(len(files), latent_dim, generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"image": self.images[index], "latent": self.latents[index], "name": self.names[index]}


def _folder_images(data: Any) -> list[Path]:
    """The images below ``data.root`` (its ``train_split`` subfolder if there is one), listed as
    every image folder is (:class:`~upzoo.data.images.ImageFolderDataset`), at most
    :data:`MAX_TESTBED_IMAGES`."""
    root = Path(data.root)
    folder = root / data.train_split if (root / data.train_split).is_dir() else root
    files = ImageFolderDataset(folder).files
    if len(files) > MAX_TESTBED_IMAGES:
        raise DataError(
            f"{folder} holds {len(files)} images; the testbed regresses at most {MAX_TESTBED_IMAGES} (it keeps them in "
            f"memory and generates all at every evaluation): point data.root at a subset"
        )
    return files


def testbed_images(data: Any, resolution: int, latent_dim: int, seed: int) -> tuple[RegressionImages, Path]:
    """The testbed's images for ``data`` (a :class:`~upzoo.sections.DataConfig`): ``kind: toyset``
    generates the first ``synthetic_train`` toyset images (seed ``synthetic_seed``) at
    ``resolution``; ``kind: images`` reads ``root`` (its ``train_split`` subfolder if there is one).

    Raises:
        ConfigError: another data kind, or a toyset with a root. DataError: the files.
    """
    if data.kind == "toyset":
        from upzoo.data.synthetic.toyset import ensure_toyset

        root = ensure_toyset(
            data.cache_dir, count=data.synthetic_train, resolution=resolution, seed=data.synthetic_seed
        )
        files = sorted((root / "train").glob("*.png"))
    elif data.kind == "images" and data.root is not None:
        root, files = Path(data.root), _folder_images(data)
    else:
        raise ConfigError(
            f"the generator testbed (pggan) regresses the embedded toyset (data.kind: toyset) or a folder of images "
            f"(data.kind: images with data.root), not data.kind {data.kind!r}"
            + (" without a root" if data.kind == "images" else "")
        )
    return RegressionImages(files, resolution, latent_dim, seed), root
