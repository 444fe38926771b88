"""Files in and out of ``upzoo predict``: which inputs a command line names (files, folders, globs,
a decathlon ``dataset.json``), reading images and NIfTI volumes (keeping the affine and header), and
writing label PNGs, colour PNGs, overlays and NIfTI label volumes atomically."""

from __future__ import annotations

import glob
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from upzoo.data.io import read_image
from upzoo.errors import DataError

__all__ = [
    "InputFile",
    "named_inputs",
    "read_input",
    "output_paths",
    "IMAGE_SUFFIXES",
    "VOLUME_SUFFIXES",
]

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


def named_inputs(inputs: Sequence[str | Path], *, volumes: bool, exclude: Path | None = None) -> list[tuple[Path, str]]:
    """The files named by files, folders (their images or volumes, sorted, subfolders included; files
    below ``exclude``, the output folder, left out), globs and ``dataset.json``, each with the name
    its outputs get: a folder's files keep their path below the folder (``city/x``), other files
    their stem (``x``).

    Raises:
        DataError: a name that matches nothing, a folder inside ``exclude``, or nothing to predict.
    """
    suffixes = VOLUME_SUFFIXES if volumes else IMAGE_SUFFIXES
    skip = exclude.resolve() if exclude is not None else None
    found: list[tuple[Path, str]] = []
    for item in inputs:
        path = Path(item)
        if path.name == "dataset.json" and path.is_file():
            found += [(p, _stem(Path(p.name))) for p in _dataset_json(path)]
        elif path.is_dir():
            if skip is not None and path.resolve().is_relative_to(skip):
                raise DataError(
                    f"--out {exclude} holds the input folder {path}; predictions must not be written among their "
                    f"inputs: choose another --out"
                )
            files = sorted(p for p in path.rglob("*") if p.is_file() and _suffix(p) in suffixes)
            files = [p for p in files if skip is None or not p.resolve().is_relative_to(skip)]
            found += [(p, _stem(p.relative_to(path))) for p in files]
        elif path.exists():
            found.append((path, _stem(Path(path.name))))
        else:
            matches = sorted(Path(p) for p in glob.glob(str(item), recursive=True) if Path(p).is_file())
            if not matches:
                raise DataError(f"{item}: no such file, folder or matching glob")
            found += [(p, _stem(Path(p.name))) for p in matches]
    if not found:
        kinds = "volumes (.nii, .nii.gz, .npy)" if volumes else "images (" + ", ".join(IMAGE_SUFFIXES) + ")"
        raise DataError(f"no {kinds} found in {', '.join(map(str, inputs))}")
    return found


def _read_nifti(path: Path) -> InputFile:
    from upzoo.data.volumes import read_nifti

    array, spacing, image = read_nifti(path)
    return InputFile(path, array, image.affine, image.header, spacing)


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
    return InputFile(path, read_image(path, channels))


def _stem(path: Path) -> str:
    """The path without its image or volume suffix, as a POSIX name (``city/x``)."""
    name = path.name
    for suffix in (".nii.gz", *VOLUME_SUFFIXES, *IMAGE_SUFFIXES):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    else:
        name = path.stem
    return (path.parent / name).as_posix()


def output_paths(name: str, out: Path, *, volumes: bool, overlay: bool, probabilities: str | None) -> dict[str, Path]:
    """Where the outputs of the input named ``name`` (see :func:`named_inputs`) go: the labels
    ``OUT/name.png`` (``.nii.gz``), and each other kind in a folder of its own: ``OUT/color/name.png``,
    ``OUT/overlay/name.png``, ``OUT/probabilities/name.npz`` (``.nii.gz``)."""
    if volumes:
        paths = {"labels": out / f"{name}.nii.gz"}
    else:
        paths = {"labels": out / f"{name}.png", "color": out / "color" / f"{name}.png"}
        if overlay:
            paths["overlay"] = out / "overlay" / f"{name}.png"
    if probabilities:
        suffix = ".nii.gz" if probabilities == "nifti" else ".npz"
        paths["probabilities"] = out / "probabilities" / f"{name}{suffix}"
    return paths
