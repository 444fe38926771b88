"""Thick-slice data on the MNI152 brain (``data.kind: mni152``): thick axial slices made as a scanner
makes them (each the mean of its thin slices, optionally with noise; see :mod:`upzoo.data.slabs`), and
on the thin grid they came from either the thin volume (through-plane super-resolution) or its tissue
labels (segmentation from thick slices, :func:`~upzoo.data.mni152.tissue_labels`).

The volume is cropped to the brain's box in ``H`` and ``W`` (with a margin) and to a whole number of
slabs in ``D``; the thick volume is made once from it, so a training patch and the validation block
see the same slabs. Training pairs are random patches of the training blocks of
:func:`~upzoo.data.mni152.coronal_split` (the anterior and posterior parts), each aligned to the slab
grid and centred on a brain voxel, flipped at random along each axis (a flip of the thin patch is the
flip of its thick slices). Validation is the whole held-out coronal block, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from upzoo.data.mni152 import coronal_split, load_mni152
from upzoo.data.seeding import sample_seed
from upzoo.data.slabs import slab_factor, thick_slices
from upzoo.errors import ConfigError

__all__ = ["ThickSliceVolume", "thick_slice_volume", "ThickSlicePatches", "ThickSliceBlock", "BOX_MARGIN"]

BOX_MARGIN = 4  # voxels of background kept around the brain's box in H and W


@dataclass(frozen=True)
class ThickSliceVolume:
    """The thin volume ``thin`` ``(D, H, W)``, its ``thick`` slices ``(D / factor, H, W)``, the brain
    ``mask``, the tissue ``labels`` on the thin grid, the ``affine`` of the thin array, its ``spacing``
    and the coronal split of ``H``."""

    thin: np.ndarray
    thick: np.ndarray
    mask: np.ndarray
    labels: np.ndarray
    affine: np.ndarray
    spacing: tuple[float, float, float]
    factor: int
    train_blocks: list[slice]
    val_block: slice


def thick_slice_volume(thickness_mm: float, noise: float = 0.0, seed: int = 0) -> ThickSliceVolume:
    """The template cropped (see the module) with its ``thickness_mm`` slices.

    Raises:
        ConfigError: nilearn missing, or a thickness that is not a whole multiple of the 1 mm voxels.
    """
    brain = load_mni152()
    factor = slab_factor(thickness_mm, brain.spacing[0])
    rows, cols = (np.flatnonzero(brain.mask.any(axis=axes)) for axes in ((0, 2), (0, 1)))
    h0, h1 = max(0, rows[0] - BOX_MARGIN), min(brain.mask.shape[1], rows[-1] + 1 + BOX_MARGIN)
    w0, w1 = max(0, cols[0] - BOX_MARGIN), min(brain.mask.shape[2], cols[-1] + 1 + BOX_MARGIN)
    depth = brain.t1.shape[0] - brain.t1.shape[0] % factor
    box = (slice(0, depth), slice(h0, h1), slice(w0, w1))
    thin, mask, labels = (np.ascontiguousarray(a[box]) for a in (brain.t1, brain.mask, brain.labels))
    affine = brain.affine.copy()
    affine[:3, 3] = brain.affine[:3, :3] @ np.array([0, h0, w0]) + brain.affine[:3, 3]
    train, val = coronal_split(thin.shape[1])
    thick = thick_slices(thin, factor, noise=noise, seed=seed)
    return ThickSliceVolume(thin, thick, mask, labels, affine, brain.spacing, factor, train, val)


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))[None]


class ThickSlicePatches(Dataset):
    """Training pairs ``{"image": (1, d / factor, h, w), "target": (1, d, h, w)}`` for a thin ``patch``
    ``(d, h, w)`` (with ``labels``: ``"mask"`` ``(d, h, w)`` int64 tissue labels in place of the
    target); ``length`` of them per epoch, drawn from (seed, epoch, index) only.

    Raises:
        ConfigError: a patch whose depth is not a whole number of slabs, or larger than a training block.
    """

    def __init__(
        self, volume: ThickSliceVolume, patch: tuple[int, int, int], length: int, augment: bool = True,
        labels: bool = False,
    ) -> None:  # fmt: skip
        d, h, w = patch
        k = volume.factor
        if d % k:
            raise ConfigError(
                f"data.crop_size {list(patch)}: its depth {d} is not a whole number of {k}-slice slabs; use "
                f"{max(k, d - d % k)}"
            )
        largest = (volume.thin.shape[0], max(b.stop - b.start for b in volume.train_blocks), volume.thin.shape[2])
        if any(p > n for p, n in zip(patch, largest)):
            raise ConfigError(
                f"data.crop_size {list(patch)} is larger than the training blocks {list(largest)}; lower it"
            )
        self.volume, self.patch, self.length, self.augment = volume, (d, h, w), length, augment
        self.labels = labels
        blocks = [b for b in volume.train_blocks if b.stop - b.start >= h]
        centres = np.argwhere(volume.mask)
        inside = np.zeros(len(centres), bool)
        for b in blocks:
            inside |= (centres[:, 1] >= b.start) & (centres[:, 1] < b.stop)
        self.centres, self.blocks = centres[inside], blocks
        self.seed, self.epoch = 0, 0

    def __len__(self) -> int:
        return self.length

    def _start(self, centre: np.ndarray) -> tuple[int, int, int]:
        """The patch's corner: centred on ``centre``, the depth on the slab grid, inside its block."""
        (d, h, w), k, shape = self.patch, self.volume.factor, self.volume.thin.shape
        block = next(b for b in self.blocks if b.start <= centre[1] < b.stop)
        z = int(np.clip(centre[0] - d // 2, 0, shape[0] - d)) // k * k
        y = int(np.clip(centre[1] - h // 2, block.start, block.stop - h))
        x = int(np.clip(centre[2] - w // 2, 0, shape[2] - w))
        return z, y, x

    def __getitem__(self, index: int) -> dict[str, Any]:
        rng = np.random.default_rng(sample_seed(self.seed, self.epoch, index))
        (d, h, w), k = self.patch, self.volume.factor
        z, y, x = self._start(self.centres[rng.integers(len(self.centres))])
        thin = self.volume.labels if self.labels else self.volume.thin
        target = thin[z : z + d, y : y + h, x : x + w]
        image = self.volume.thick[z // k : (z + d) // k, y : y + h, x : x + w]
        if self.augment:
            for axis in range(3):
                if rng.random() < 0.5:
                    target, image = np.flip(target, axis), np.flip(image, axis)
        if self.labels:
            return {"image": _tensor(image), "mask": torch.from_numpy(target.astype(np.int64))}
        return {"image": _tensor(image), "target": _tensor(target)}


class ThickSliceBlock(Dataset):
    """The held-out coronal block, whole: one item ``{"image", "target", "mask", "labels", "name"}``
    (``mask`` the brain, ``labels`` the tissue labels, int64)."""

    def __init__(self, volume: ThickSliceVolume) -> None:
        self.volume = volume

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index != 0:
            raise IndexError(index)
        v, block = self.volume, self.volume.val_block
        return {
            "image": _tensor(v.thick[:, block]),
            "target": _tensor(v.thin[:, block]),
            "mask": torch.from_numpy(np.ascontiguousarray(v.mask[:, block])),
            "labels": torch.from_numpy(v.labels[:, block].astype(np.int64)),
            "name": f"mni152 coronal block y {block.start}-{block.stop - 1}",
        }
