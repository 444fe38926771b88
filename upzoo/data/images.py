"""Any folder of images (for GAN training)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset

from upzoo.data.io import read_image
from upzoo.data.seeding import reseed
from upzoo.errors import DataError

__all__ = ["ImageFolderDataset", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")


class ImageFolderDataset(Dataset):
    """Samples ``{"image": (3, H, W) float, "name": str}`` from every image below ``root``.

    Raises:
        DataError: missing folder or no images (at construction); unreadable files (when read).
    """

    def __init__(self, root: str | Path, transform: Callable | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DataError(f"image folder {self.root} does not exist")
        self.files = sorted(p for p in self.root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        if not self.files:
            raise DataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) below {self.root}")
        self.transform = transform
        self.seed, self.epoch = 0, 0  # augmentation depends only on (seed, epoch, index)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict:
        image = read_image(self.files[index])
        reseed(self.transform, self.seed, self.epoch, index)
        if self.transform is not None:
            tensor = self.transform(image=image)["image"]
        else:
            tensor = torch.from_numpy(image).permute(2, 0, 1).float() / 127.5 - 1
        return {"image": tensor, "name": self.files[index].name}
