"""Files in and out of ``upzoo predict``: which inputs a command line names (files, folders, globs,
a decathlon ``dataset.json``), reading images and NIfTI volumes (keeping the affine and header), and
writing label PNGs, colour PNGs, overlays and NIfTI label volumes atomically."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from upzoo.errors import DataError

__all__ = ["InputFile", "expand_inputs", "read_input", "output_paths", "IMAGE_SUFFIXES", "VOLUME_SUFFIXES"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
VOLUME_SUFFIXES = (".nii", ".nii.gz", ".npy")


@dataclass
class InputFile:
    """A read input: the array (``(H, W[, C])`` uint8 image, or ``([C,] D, H, W)`` float32 volume),
    and for NIfTI volumes the source affine, header and spacing (``(D, H, W)`` order)."""

    path: Path
    array: np.ndarray
    affine: np.ndarray | None = None
    header: Any = None
    spacing: tuple[float, ...] | None = None


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return ".nii.gz" if name.endswith(".nii.gz") else path.suffix.lower()


def _dataset_json(path: Path) -> list[Path]:
    try:
        listing = json.loads(path.read_text()).get("test")
    except (OSError, ValueError, AttributeError) as exc:
        raise DataError(f"{path}: not a readable dataset.json ({exc})") from None
    if not isinstance(listing, list) or not listing:
        raise DataError(f"{path}: has no 'test' list of volumes to predict")
    return [(path.parent / (item if isinstance(item, str) else item.get("image", ""))).resolve() for item in listing]


def expand_inputs(inputs: Sequence[str | Path], *, volumes: bool) -> list[Path]:
    """The files named by files, folders (their images or volumes, sorted, subfolders included), globs
    and ``dataset.json``.

    Raises:
        DataError: a name that matches nothing, or nothing to predict at all.
    """
    suffixes = VOLUME_SUFFIXES if volumes else IMAGE_SUFFIXES
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.name == "dataset.json" and path.is_file():
            found += _dataset_json(path)
        elif path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and _suffix(p) in suffixes)
        elif path.exists():
            found.append(path)
        else:
            matches = sorted(Path(p) for p in glob.glob(str(item), recursive=True) if Path(p).is_file())
            if not matches:
                raise DataError(f"{item}: no such file, folder or matching glob")
            found += matches
    if not found:
        kinds = "volumes (.nii, .nii.gz, .npy)" if volumes else "images (" + ", ".join(IMAGE_SUFFIXES) + ")"
        raise DataError(f"no {kinds} found in {', '.join(map(str, inputs))}")
    return found


def _read_image(path: Path, channels: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return np.array(image.convert("RGB" if channels == 3 else "L" if channels == 1 else image.mode))
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable image ({type(exc).__name__}: {exc})") from None


def _read_nifti(path: Path) -> InputFile:
    import nibabel as nib

    try:
        image = nib.load(str(path))
        array = np.asarray(image.dataobj, dtype=np.float32)
    except Exception as exc:  # nibabel raises many kinds for a damaged file
        raise DataError(f"{path}: unreadable or truncated volume ({type(exc).__name__}: {exc})") from None
    if array.ndim not in (3, 4):
        raise DataError(f"{path}: expected a 3D volume (or 4D with channels last), got shape {array.shape}")
    zooms = tuple(float(f"{float(z):.6g}") for z in image.header.get_zooms()[:3])
    order = (2, 1, 0) if array.ndim == 3 else (3, 2, 1, 0)  # (x, y, z[, c]) -> ([c,] z, y, x)
    array = np.ascontiguousarray(array.transpose(order))
    return InputFile(path, array, image.affine, image.header, zooms[::-1])


def read_input(path: str | Path, *, volumes: bool, channels: int) -> InputFile:
    """Read one image or volume.

    Raises:
        DataError: missing, unreadable, or of a kind this model does not take (naming the file).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    suffix = _suffix(path)
    if volumes:
        if suffix not in VOLUME_SUFFIXES:
            raise DataError(f"{path}: a 3D model predicts volumes (.nii, .nii.gz, .npy), got a {suffix or 'file'}")
        if suffix == ".npy":
            from upzoo.data.volumes import read_volume

            return InputFile(path, read_volume(path)[0])
        return _read_nifti(path)
    if suffix in VOLUME_SUFFIXES:
        raise DataError(f"{path}: a 2D model predicts images ({', '.join(IMAGE_SUFFIXES)}), got a volume")
    return InputFile(path, _read_image(path, channels))


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".nii.gz", *VOLUME_SUFFIXES, *IMAGE_SUFFIXES):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def output_paths(path: Path, out: Path, *, volumes: bool, overlay: bool, probabilities: str | None) -> dict[str, Path]:
    """Where the outputs of input ``path`` go: ``labels`` (and ``color``, ``overlay``, ``probabilities``)."""
    stem = _stem(path)
    if volumes:
        paths = {"labels": out / f"{stem}.nii.gz"}
    else:
        paths = {"labels": out / f"{stem}.png", "color": out / f"{stem}_color.png"}
        if overlay:
            paths["overlay"] = out / f"{stem}_overlay.png"
    if probabilities:
        paths["probabilities"] = out / (f"{stem}_probabilities.nii.gz" if probabilities == "nifti" else f"{stem}.npz")
    return paths


def atomic_write(path: Path, write) -> None:
    """``write(tmp_path)`` then rename over ``path``: a reader never sees half a file."""
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
