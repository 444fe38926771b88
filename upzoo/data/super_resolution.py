"""Super-resolution pairs: a high-resolution image (``target``) and its MATLAB-bicubic downscale
(``image``), both in [0, 1]. The low-resolution image is rounded to 8 bits, as the PNG files of
DIV2K and Set5 are, so a figure here is measured like a paper's.

Training items are paired random crops, as BasicSR's ``paired_random_crop``: each whole image is
mod-cropped and degraded once, and a ``crop_size`` crop (a multiple of the scale) of the
high-resolution image is taken with the crop of the low-resolution image at the same place (so the
low-resolution crop is the degraded whole image's, not a degradation of the crop with
its own mirrored borders), then both get the same flips and 90-degree rotations;
``patches_per_image`` per image and epoch, drawn from (seed, epoch, index) only. Held-out items
are whole images cropped to a multiple of the scale at the bottom and right
(BasicSR's ``mod_crop``). Sources: the embedded street scenes, a Cityscapes layout, a folder with
``train``/``val`` subfolders, or the package photographs (:mod:`upzoo.data.package_images`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from upzoo.data.bicubic import bicubic_downscale
from upzoo.data.images import IMAGE_SUFFIXES
from upzoo.data.io import read_image
from upzoo.data.package_images import PACKAGE_TEST, PACKAGE_TRAIN, package_image_path
from upzoo.data.seeding import sample_seed
from upzoo.errors import ConfigError, DataError

__all__ = ["SuperResolutionPatches", "SuperResolutionImages", "degrade", "mod_crop", "image_sources"]


@functools.lru_cache(maxsize=16)
def _read(path: Path, channels: int) -> np.ndarray:
    return read_image(path, channels=channels)


def _tensor(array: np.ndarray) -> torch.Tensor:
    """``(H, W[, C])`` uint8 -> ``(C, H, W)`` float32 in [0, 1]."""
    tensor = torch.from_numpy(np.ascontiguousarray(array)).float() / 255.0
    return tensor[None] if tensor.ndim == 2 else tensor.permute(2, 0, 1)


def degrade(target: torch.Tensor, scale: int) -> torch.Tensor:
    """The low-resolution input of ``target`` ``(..., H, W)`` in [0, 1]: MATLAB-bicubic downscale by
    ``scale``, clipped to [0, 1] and rounded to 8 bits."""
    return torch.round(bicubic_downscale(target, scale).clamp(0, 1) * 255.0) / 255.0


def mod_crop(array: np.ndarray, scale: int) -> np.ndarray:
    """``array`` ``(H, W[, C])`` without the bottom rows and right columns beyond a multiple of ``scale``."""
    height, width = array.shape[:2]
    return array[: height - height % scale, : width - width % scale]


@functools.lru_cache(maxsize=16)
def _degraded(path: Path, channels: int, scale: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The mod-cropped image ``(C, H, W)`` and its low-resolution version ``(C, H / s, W / s)``."""
    target = _tensor(mod_crop(_read(path, channels), scale))
    return target, degrade(target, scale)


class _Pairs(Dataset):
    def __init__(self, sources: Sequence[Path], scale: int, channels: int) -> None:
        if not sources:
            raise DataError("super-resolution: no images to read")
        self.sources, self.scale, self.channels = list(sources), scale, channels
        self.seed, self.epoch = 0, 0

    def _image(self, index: int) -> np.ndarray:
        return _read(self.sources[index], self.channels)


class SuperResolutionPatches(_Pairs):
    """Training pairs ``{"image": (C, crop / scale, ...), "target": (C, crop, crop)}``.

    Raises:
        DataError: an image smaller than the crop (at construction, from the headers; naming the
            file and the sizes), or unreadable files.
    """

    def __init__(
        self, sources: Sequence[Path], scale: int, channels: int, crop_size: tuple[int, int], *,
        patches_per_image: int, augment: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(sources, scale, channels)
        self.crop_size, self.patches, self.augment = tuple(crop_size), patches_per_image, augment
        _check_sizes(self.sources, self.crop_size)

    def __len__(self) -> int:
        return len(self.sources) * self.patches

    def __getitem__(self, index: int) -> dict[str, Any]:
        source = index % len(self.sources)
        image = self._image(source)
        (height, width), (ch, cw) = image.shape[:2], self.crop_size
        if height < ch or width < cw:
            raise DataError(
                f"{self.sources[source]}: the image is {height}x{width}, smaller than the training crop {ch}x{cw}; "
                f"lower data.crop_size or leave the image out"
            )
        target, low = _degraded(self.sources[source], self.channels, self.scale)
        s = self.scale
        rng = np.random.default_rng(sample_seed(self.seed, self.epoch, index))
        top = int(rng.integers(0, (target.shape[1] - ch) // s + 1))  # in low-resolution pixels
        left = int(rng.integers(0, (target.shape[2] - cw) // s + 1))
        pair = [
            target[:, top * s : top * s + ch, left * s : left * s + cw],
            low[:, top : top + ch // s, left : left + cw // s],
        ]
        if self.augment:
            for flip in ([2], [1]):
                if rng.random() < 0.5:
                    pair = [p.flip(flip) for p in pair]
            if ch == cw and rng.random() < 0.5:
                pair = [p.transpose(1, 2) for p in pair]
        return {"image": pair[1].contiguous(), "target": pair[0].contiguous()}


def _check_sizes(sources: Sequence[Path], crop: tuple[int, int], what: str = "the training crop") -> None:
    """Every image at least ``crop``, from the files' headers (nothing decoded), so that a small
    image is refused before a run starts.

    Raises:
        DataError: naming the first image smaller than the crop.
    """
    from PIL import Image, UnidentifiedImageError

    for path in sources:
        try:
            with Image.open(path) as img:
                width, height = img.size
        except (OSError, UnidentifiedImageError) as exc:
            raise DataError(f"{path}: unreadable image ({exc})") from None
        if height < crop[0] or width < crop[1]:
            raise DataError(
                f"{path}: the image is {height}x{width}, smaller than {what} {crop[0]}x{crop[1]}; "
                f"{'lower data.crop_size or ' if what == 'the training crop' else ''}leave the image out"
            )


class SuperResolutionImages(_Pairs):
    """Held-out pairs ``{"image", "target", "name"}``: whole images, mod-cropped to the scale.

    Raises:
        DataError: an image too small to measure (at construction: SSIM's 11-pixel window must fit
            inside the scale's cropped border).
    """

    def __init__(self, sources: Sequence[Path], scale: int, channels: int, names: Sequence[str] | None = None) -> None:
        super().__init__(sources, scale, channels)
        self.names = list(names) if names is not None else [p.stem for p in self.sources]
        side = 11 + 3 * scale  # SSIM's window after the border of `scale` is cropped, and the mod-crop
        _check_sizes(self.sources, (side, side), f"what x{scale} can be measured on:")

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> dict[str, Any]:
        image = mod_crop(self._image(index), self.scale)
        target = _tensor(image)
        return {"image": degrade(target, self.scale), "target": target, "name": self.names[index]}


def _files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise DataError(f"image folder {folder} does not exist")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise DataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) below {folder}")
    return files


def image_sources(data: Any, scenes: Path | None = None) -> tuple[list[Path], list[Path], list[str]]:
    """The training files, the held-out files and the held-out names of ``data`` (a ``DataConfig``;
    ``scenes``: the embedded street scenes' folder, for ``cityscapes`` without a root).

    Raises:
        ConfigError: a data kind without images. DataError: missing folders, files or packages.
    """
    if data.kind == "package_images":
        train = [package_image_path(n) for n in data.package_train or PACKAGE_TRAIN]
        names = list(data.package_val or PACKAGE_TEST)
        return train, [package_image_path(n) for n in names], names
    if data.kind == "volumes":
        raise ConfigError("data.kind 'volumes' does not fit a super-resolution recipe; use images, cityscapes or "
                          "package_images")  # fmt: skip
    if data.kind == "cityscapes":
        root = Path(data.root) if data.root is not None else scenes
        folders = (root / "leftImg8bit" / data.train_split, root / "leftImg8bit" / data.val_split)
    else:
        if data.root is None:
            raise ConfigError("data.kind 'images' needs data.root, a folder with train/ and val/ subfolders of images")
        root = Path(data.root)
        folders = (root / data.train_split, root / data.val_split)
        if not all(f.is_dir() for f in folders):
            raise DataError(
                f"{root}: super-resolution reads training and held-out images from {data.train_split}/ and "
                f"{data.val_split}/ subfolders; make them (or set data.train_split/val_split)"
            )
    held_out = _files(folders[1])
    return _files(folders[0]), held_out, [p.stem for p in held_out]
