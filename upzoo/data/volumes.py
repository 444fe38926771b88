"""Medical volumes: NIfTI (``.nii``, ``.nii.gz``, through nibabel) and ``.npy``; image/label pairs
from a decathlon-style ``dataset.json`` or the folder convention ``imagesTr/`` + ``labelsTr/``
(same file names); voxel spacing from the header; intensity normalisation; random patches with
foreground oversampling (sliding-window inference lives in :mod:`upzoo.inference`).

Arrays are ``(D, H, W)``: NIfTI's ``(x, y, z)`` voxel axes reversed, so that the slice axis of a
typical scan comes first and its spacing is ``spacing[0]`` (``5.0`` in a 5.0 x 0.8 x 0.8 mm volume).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from upzoo.checks import check_spacing
from upzoo.data.decathlon import read_dataset_json, resolve_inside
from upzoo.data.resampling import read_spacing
from upzoo.data.seeding import reseed
from upzoo.errors import DataError, ShapeError
from upzoo.runtime import atomic_write

__all__ = [
    "read_volume",
    "write_nifti",
    "VolumeCase",
    "find_cases",
    "validation_split",
    "normalize_intensity",
    "sample_patch",
    "VolumeDataset",
]

Normalization = Literal["zscore", "ct", "minmax", "none"]
_SUFFIXES = (".nii.gz", ".nii", ".npy")


def _is_volume(path: Path) -> bool:
    return path.name.endswith(_SUFFIXES)


def read_volume(path: str | Path) -> tuple[np.ndarray, tuple[float, ...]]:
    """Read a volume: ``(D, H, W)`` (or ``(C, D, H, W)`` for 4D NIfTI) float32 and the spacing in mm.

    ``.npy`` files carry no spacing: 1.0 per axis, unless the dataset gives one.

    Raises:
        DataError: missing, unreadable or truncated file, not 3D/4D, NaN/inf voxels, or a header
            spacing that is not a voxel size.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    if not path.name.endswith(".npy"):
        array, spacing, _ = read_nifti(path)
        return array, spacing
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises many kinds for a damaged file
        raise DataError(f"{path}: unreadable or truncated volume ({type(exc).__name__}: {exc})") from None
    return _checked(array, path), (1.0, 1.0, 1.0)


def read_nifti(path: str | Path) -> tuple[np.ndarray, tuple[float, ...], Any]:
    """A NIfTI volume as ``([C,] D, H, W)`` float32, its spacing ``(D, H, W)`` in mm from the header
    as written (checked before any voxel is read: nibabel would repair a zero or negative one), and
    the nibabel image (its affine and header, to write predictions back on the same grid).

    Raises:
        DataError: as :func:`read_volume`.
    """
    import nibabel as nib

    path = Path(path)
    spacing = read_spacing(path)
    try:
        image = nib.load(str(path))
        array = np.asarray(image.dataobj)
    except Exception as exc:  # nibabel raises many kinds for a damaged file
        raise DataError(f"{path}: unreadable or truncated volume ({type(exc).__name__}: {exc})") from None
    if array.ndim in (3, 4):
        array = array.transpose((2, 1, 0) if array.ndim == 3 else (3, 2, 1, 0))  # (x, y, z[, c]) -> ([c,] z, y, x)
    return _checked(array, path), spacing, image


def _checked(array: np.ndarray, path: Path) -> np.ndarray:
    if array.ndim not in (3, 4):
        raise DataError(f"{path}: expected a 3D volume (or 4D with channels), got shape {array.shape}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    refuse_non_finite(array, path)
    return array


def refuse_non_finite(array: np.ndarray, path: str | Path) -> None:
    """Raise ``DataError`` naming ``path`` and the count when ``array`` holds NaN or inf: they would
    make every probability NaN and every label class 0."""
    bad = int(array.size - np.count_nonzero(np.isfinite(array)))
    if bad:
        raise DataError(
            f"{path}: {bad} of {array.size} voxels are NaN or infinite; replace them (e.g. numpy.nan_to_num) "
            f"before training or predicting"
        )


def write_nifti(path: str | Path, array: np.ndarray, spacing: Sequence[float]) -> None:
    """Write a ``(D, H, W)`` array as NIfTI with voxel sizes ``spacing`` (atomically).

    Raises:
        ShapeError: ``array`` is not a 3D NumPy array. ConfigError: ``spacing`` is not three positive
            finite sizes in mm.
    """
    import nibabel as nib

    if not isinstance(array, np.ndarray) or array.ndim != 3:
        shown = array.shape if isinstance(array, np.ndarray) else type(array).__name__
        raise ShapeError(f"write_nifti: array must be a NumPy array (D, H, W), got {shown}")
    spacing = check_spacing(spacing, "write_nifti: spacing")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    xyz = np.ascontiguousarray(array.transpose(2, 1, 0))
    affine = np.diag([*reversed([float(s) for s in spacing]), 1.0])
    image = nib.Nifti1Image(xyz, affine)
    image.header.set_zooms(tuple(reversed([float(s) for s in spacing])))
    atomic_write(path, lambda tmp: nib.save(image, str(tmp)))


@dataclass(frozen=True)
class VolumeCase:
    image: Path
    label: Path


def find_cases(root: str | Path, *, allow_outside_root: bool = False) -> tuple[list[VolumeCase], dict]:
    """All labelled cases under ``root`` and the checked dataset description (see
    :func:`~upzoo.data.decathlon.read_dataset_json`; empty fields without ``dataset.json``).

    Raises:
        DataError: missing folder, an invalid ``dataset.json``, a listed path outside ``root``
            (unless ``allow_outside_root``), a listed or found image without its label, no cases.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"volume dataset folder {root} does not exist")
    meta: dict = {"training": [], "test": [], "labels": None, "spacing": None, "validation_count": None}
    cases = []
    listing = root / "dataset.json"
    if listing.is_file():
        meta = read_dataset_json(listing)
        for i, entry in enumerate(meta["training"]):
            image, label = (
                resolve_inside(root, entry[k], f"{listing}: training[{i}].{k}", allow_outside=allow_outside_root)
                for k in ("image", "label")
            )
            cases.append(VolumeCase(image, label))
    else:
        for images, labels in (("imagesTr", "labelsTr"), ("images", "labels")):
            if (root / images).is_dir():
                for image in sorted(p for p in (root / images).iterdir() if _is_volume(p)):
                    cases.append(VolumeCase(image, root / labels / image.name))
                break
        else:
            raise DataError(f"{root}: expected dataset.json, imagesTr/ + labelsTr/, or images/ + labels/")
    for case in cases:
        for kind, path in (("image", case.image), ("label", case.label)):
            if not path.is_file():
                raise DataError(
                    f"{kind} {path} does not exist" + (f" (for image {case.image})" if kind == "label" else "")
                )
    if not cases:
        raise DataError(f"{root}: no labelled volumes found")
    return cases, meta


def validation_split(count: int | None, total: int, where: str) -> int:
    """How many of ``total`` cases validate: ``count`` (``validation_count``) or 20 %, at least 1,
    always leaving at least one case for training, so that no case is in both splits.

    Raises:
        DataError: a count outside ``1..total - 1``, or fewer than two cases.
    """
    if count is None:
        count = max(1, round(0.2 * total))
    if not 1 <= count <= total - 1:
        need = "; a dataset needs at least 2 cases (one to train on, one to validate)" if total < 2 else ""
        raise DataError(
            f"{where}: validation_count must be in 1..{total - 1} for {total} cases so that validation "
            f"never sees training cases, got {count}{need}"
        )
    return count


def normalize_intensity(
    volume: np.ndarray, mode: Normalization, window: Sequence[float] = (-1000.0, 1000.0)
) -> np.ndarray:
    """``zscore`` (over the volume), ``ct`` (clip to ``window``, scale to [0, 1]), ``minmax``, ``none``."""
    if mode == "zscore":
        return (volume - volume.mean()) / max(float(volume.std()), 1e-6)
    if mode == "ct":
        low, high = float(window[0]), float(window[1])
        return (np.clip(volume, low, high) - low) / (high - low)
    if mode == "minmax":
        low, high = float(volume.min()), float(volume.max())
        return (volume - low) / max(high - low, 1e-6)
    return volume


def sample_patch(
    image: np.ndarray, label: np.ndarray, patch: Sequence[int], rng: np.random.Generator, foreground_ratio: float
) -> tuple[np.ndarray, np.ndarray]:
    """A random ``patch`` of ``image`` (``(C, D, H, W)``) and ``label`` (``(D, H, W)``); with probability
    ``foreground_ratio`` it is centred on a random foreground voxel. Volumes smaller than the patch
    are zero-padded (label 0)."""
    shape = label.shape
    pad = [max(0, p - s) for p, s in zip(patch, shape)]
    if any(pad):
        widths = [(q // 2, q - q // 2) for q in pad]
        image = np.pad(image, [(0, 0)] + widths)
        label = np.pad(label, widths)
        shape = label.shape
    if rng.random() < foreground_ratio and label.any():
        fg = np.argwhere(label > 0)
        center = fg[rng.integers(len(fg))]
        start = [int(np.clip(c - p // 2, 0, s - p)) for c, p, s in zip(center, patch, shape)]
    else:
        start = [int(rng.integers(0, s - p + 1)) for p, s in zip(patch, shape)]
    index = tuple(slice(s, s + p) for s, p in zip(start, patch))
    return image[(slice(None),) + index], label[index]


class VolumeDataset(Dataset):
    """Volume samples ``{"image": (C, D, H, W) float, "mask": (D, H, W) int64, "spacing", "name"}``.

    Args:
        root: a decathlon-style folder (``dataset.json``) or ``imagesTr/`` + ``labelsTr/``.
        split: ``train`` (random patches) or ``val`` (whole volumes); the last ``val_count`` cases
            (``dataset.json``'s ``validation_count``, else 20 %) are the validation split.
        patch_size: training patch ``(D, H, W)``; ``None`` returns whole volumes.
        normalize: intensity normalisation (see :func:`normalize_intensity`).
        ct_window: the ``ct`` normalisation's window (low, high).
        foreground_ratio: share of training patches centred on foreground.
        transform: an albumentations pipeline taking ``volume`` and ``mask3d`` (optional).
        seed: base seed of the patch sampler (combined with the epoch and index).
        num_classes: classes when ``dataset.json`` lists no ``labels`` (the model's); labels must
            be whole numbers in ``0..num_classes-1`` (``0..255`` when neither is known).
        channels: image channels every case must have (the model's ``in_channels``), if known.
        allow_outside_root: let ``dataset.json`` list files outside ``root``.
        target_spacing: resample every case to this ``(D, H, W)`` spacing in mm (see
            :mod:`upzoo.data.resampling`), cached under ``cache_dir`` so that it is done once.

    Raises:
        DataError: layout problems at construction; unreadable files, image/label shape mismatch,
            the wrong channel count and labels outside ``0..num_classes-1`` when a case is read,
            naming the file and the value.
    """

    ignore_index = 255

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        *,
        patch_size: Sequence[int] | None = None,
        normalize: Normalization = "zscore",
        ct_window: Sequence[float] = (-1000.0, 1000.0),
        foreground_ratio: float = 0.33,
        transform: Callable | None = None,
        seed: int = 0,
        num_classes: int | None = None,
        channels: int | None = None,
        allow_outside_root: bool = False,
        target_spacing: Sequence[float] | None = None,
        cache_dir: str | Path | None = None,
    ) -> None:
        cases, meta = find_cases(root, allow_outside_root=allow_outside_root)
        if split not in ("train", "val"):
            raise DataError(f"split must be 'train' or 'val' for volumes, got {split!r}")
        val_count = validation_split(meta["validation_count"], len(cases), str(root))
        self.cases = cases[: len(cases) - val_count] if split == "train" else cases[len(cases) - val_count :]
        self.class_names = meta["labels"]
        self.num_classes = len(self.class_names) if self.class_names else num_classes
        self.channels = channels
        self.spacing_override = meta["spacing"]
        self.target_spacing = tuple(float(v) for v in target_spacing) if target_spacing is not None else None
        self.cache_dir = cache_dir
        self.split, self.patch_size, self.normalize, self.ct_window = split, patch_size, normalize, ct_window
        self.foreground_ratio, self.transform, self.seed, self.epoch = foreground_ratio, transform, seed, 0

    def __len__(self) -> int:
        return len(self.cases)

    def spacing(self, index: int = 0) -> tuple[float, ...]:
        """Voxel spacing of a case as the model sees it: the target spacing when resampling, else
        the header's (or ``dataset.json``'s)."""
        return self.target_spacing or self.source_spacing(index)

    def source_spacing(self, index: int = 0) -> tuple[float, ...]:
        """Voxel spacing of a case's file (header only, or ``dataset.json``'s ``spacing``)."""
        from upzoo.data.resampling import read_spacing

        return self.spacing_override or read_spacing(self.cases[index].image)

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
        """A whole case, normalised: image ``(C, D, H, W)``, label ``(D, H, W)`` uint8, spacing; with a
        target spacing resampled to it first (once: the result is cached)."""
        case = self.cases[index]
        if self.target_spacing is None:
            image, label, spacing = self._read(index)
        else:
            from upzoo.data.resampling import cached_resampled_case

            image, label = cached_resampled_case(
                case.image, case.label, lambda: self._read(index), self.target_spacing, self.cache_dir
            )
            self._check_contents(case, image, label)  # a cached case may meet a recipe with other classes
            spacing = self.target_spacing
        classes = self.num_classes or 256
        image = np.stack([normalize_intensity(c, self.normalize, self.ct_window) for c in image]).astype(np.float32)
        return image, label.astype(np.uint8 if classes <= 256 else np.int64), spacing

    def _read(self, index: int) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
        """A case as stored: image ``(C, D, H, W)``, labels ``(D, H, W)`` (checked), spacing."""
        case = self.cases[index]
        image, spacing = read_volume(case.image)
        label, _ = read_volume(case.label)
        if image.ndim == 3:
            image = image[None]
        if label.ndim != 3 or label.shape != image.shape[1:]:
            raise DataError(
                f"{case.label}: label shape {label.shape} does not match image {case.image} {image.shape[1:]}"
            )
        self._check_contents(case, image, label)
        return image, label.astype(np.int64), self.spacing_override or spacing

    def _check_contents(self, case: VolumeCase, image: np.ndarray, label: np.ndarray) -> None:
        if self.channels is not None and image.shape[0] != self.channels:
            raise DataError(
                f"{case.image}: a volume with {image.shape[0]} channel(s), but the model takes "
                f"{self.channels} (model.in_channels)"
            )
        classes = self.num_classes or 256
        fractional = label[label != np.round(label)]
        if fractional.size:
            raise DataError(
                f"{case.label}: labels must be whole numbers, got {fractional.size} voxel(s) like "
                f"{float(fractional.flat[0]):g}; save the label map with integer class indices"
            )
        if label.min() < 0 or label.max() >= classes:
            raise DataError(
                f"{case.label}: labels must be in 0..{classes - 1} (the classes of dataset.json or "
                f"model.num_classes), got values in {label.min():g}..{label.max():g}"
            )

    def __getitem__(self, index: int) -> dict:
        image, label, spacing = self.load(index)
        if self.split == "train" and self.patch_size is not None:
            rng = np.random.default_rng([self.seed, self.epoch, index])
            image, label = sample_patch(image, label, self.patch_size, rng, self.foreground_ratio)
        if self.transform is not None:
            reseed(self.transform, self.seed, self.epoch, index)
            out = self.transform(volume=np.ascontiguousarray(image.transpose(1, 2, 3, 0)), mask3d=label)
            image = np.ascontiguousarray(np.asarray(out["volume"]).transpose(3, 0, 1, 2))
            label = np.asarray(out["mask3d"])
        return {
            "image": torch.from_numpy(np.ascontiguousarray(image)).float(),
            "mask": torch.from_numpy(np.ascontiguousarray(label)).long(),
            "spacing": torch.tensor(spacing),
            "name": self.cases[index].image.name,
        }
