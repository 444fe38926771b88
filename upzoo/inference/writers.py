"""Writing predictions: label PNGs (train ids, uint8), colour PNGs in the dataset's palette,
overlays, and NIfTI label volumes with the source's affine and header; every file atomically."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from upzoo.inference.files import InputFile
from upzoo.runtime import atomic_write

__all__ = ["default_palette", "colorize", "write_image_prediction", "write_volume_prediction"]


def default_palette(num_classes: int) -> np.ndarray:
    """``(K, 3)`` uint8 colours for a dataset without a palette (matplotlib's tab20, repeated).

    >>> default_palette(3).shape
    (3, 3)
    """
    from matplotlib import colormaps

    colours = colormaps["tab20"](np.arange(num_classes) % 20)[:, :3]
    return (colours * 255).round().astype(np.uint8)


def colorize(labels: np.ndarray, palette: np.ndarray) -> np.ndarray:
    """``(H, W)`` labels -> ``(H, W, 3)`` uint8 colours (labels beyond the palette are black)."""
    table = np.zeros((max(256, len(palette)), 3), dtype=np.uint8)
    table[: len(palette)] = palette[:, :3]
    return table[labels]


def _save_png(path: Path, array: np.ndarray) -> None:
    from PIL import Image

    atomic_write(path, lambda tmp: Image.fromarray(array).save(tmp, format="PNG", compress_level=1))


def write_image_prediction(
    paths: dict[str, Path],
    labels: np.ndarray,
    palette: np.ndarray,
    image: np.ndarray | None = None,
    probabilities: np.ndarray | None = None,
) -> None:
    """The label PNG, the colour PNG (indexed, with the palette: ``convert("RGB")`` gives the
    colours), (with ``paths["overlay"]`` and the image) the overlay: the image with the colours
    blended in at half opacity, and the probabilities (float16 ``.npz``)."""
    from PIL import Image

    _save_png(paths["labels"], labels.astype(np.uint8))
    coloured = Image.fromarray(labels.astype(np.uint8), "L").convert("P")  # an indexed PNG: 5x faster to write
    coloured.putpalette(colorize(np.arange(256, dtype=np.uint8), palette).tobytes())
    atomic_write(paths["color"], lambda tmp: coloured.save(tmp, format="PNG", compress_level=1))
    if "overlay" in paths and image is not None:
        colours = colorize(labels, palette)
        rgb = image if image.ndim == 3 and image.shape[2] == 3 else np.repeat(image.reshape(*image.shape[:2], 1), 3, 2)
        blended = (0.5 * rgb.astype(np.float32) + 0.5 * colours.astype(np.float32)).round().astype(np.uint8)
        _save_png(paths["overlay"], blended)
    if probabilities is not None and "probabilities" in paths:
        atomic_write(paths["probabilities"], lambda tmp: _save_npz(tmp, probabilities.astype(np.float16)))


def _nifti_like(source: InputFile, array_zyx: np.ndarray, dtype: type):
    """A NIfTI image of ``([K,] D, H, W)`` data in the source's voxel grid: its affine and header."""
    import nibabel as nib

    order = (2, 1, 0) if array_zyx.ndim == 3 else (3, 2, 1, 0)
    data = np.ascontiguousarray(array_zyx.transpose(order)).astype(dtype)  # -> (x, y, z[, K])
    header = source.header.copy() if source.header is not None else None
    image = nib.Nifti1Image(data, source.affine if source.affine is not None else np.eye(4), header)
    image.set_data_dtype(dtype)
    image.header.set_slope_inter(1.0, 0.0)  # labels are stored as they are, whatever the source's scaling
    return image


def write_volume_prediction(
    paths: dict[str, Path], labels: np.ndarray, source: InputFile, probabilities: np.ndarray | None = None
) -> None:
    """The label volume as NIfTI in the source's grid (same shape, affine and header; uint8), and
    the class probabilities: a 4D float32 NIfTI, classes last (NIfTI-1 has no float16), or float16
    ``.npz`` with ``(K, D, H, W)``."""
    import nibabel as nib

    atomic_write(paths["labels"], lambda tmp: nib.save(_nifti_like(source, labels, np.uint8), str(tmp)))
    if probabilities is None or "probabilities" not in paths:
        return
    target = paths["probabilities"]
    if target.name.endswith(".npz"):
        atomic_write(target, lambda tmp: _save_npz(tmp, probabilities.astype(np.float16)))
    else:
        atomic_write(target, lambda tmp: nib.save(_nifti_like(source, probabilities, np.float32), str(tmp)))


def _save_npz(path: Path, probabilities: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.savez would append .npz to the temporary name
        np.savez_compressed(f, probabilities=probabilities)
