"""Resampling volumes to a voxel spacing, the way nnU-Net does: images by cubic B-spline
interpolation, label maps class by class (each class's indicator interpolated linearly, the largest wins), both
keeping the field of view — voxel centres move, the volume's physical extent and the position of
everything in it stay. Used by training (``data.target_spacing``, cached once per case) and by
``upzoo predict`` (each volume to the training spacing, the prediction back to the source grid).

Shapes are ``(D, H, W)``; spacings are millimetres per voxel in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from upzoo.checks import check_sizes, check_spacing
from upzoo.errors import DataError

__all__ = [
    "resampled_shape",
    "resample_image",
    "resample_labels",
    "read_spacing",
    "median_spacing",
    "cached_resampled_case",
]


#: the most voxels a resampled volume may have (8 GiB per float32 channel): beyond it, a spacing is
#: in the wrong unit and the resampling would exhaust the memory before saying anything
MAX_RESAMPLED_VOXELS = 2**31


def resampled_shape(shape: Sequence[int], spacing: Sequence[float], target: Sequence[float]) -> tuple[int, ...]:
    """The ``(D, H, W)`` that covers the same extent at ``target`` spacing: ``round(n * s / t)``, at
    least 1 per axis (nnU-Net's rule).

    >>> resampled_shape((12, 48, 48), (10.0, 1.6, 1.6), (5.0, 0.8, 0.8))
    (24, 96, 96)

    Raises:
        ConfigError: ``shape`` not whole numbers >= 1, or a spacing that is not one positive finite
            size in mm per axis of ``shape``. DataError: a result of more than
            :data:`MAX_RESAMPLED_VOXELS` voxels.
    """
    shape = check_sizes(shape, "shape")
    spacing = check_spacing(spacing, f"spacing (one per axis of shape {shape})", axes=len(shape))
    target = check_spacing(target, f"target spacing (one per axis of shape {shape})", axes=len(shape))
    out = tuple(max(1, round(n * s / t)) for n, s, t in zip(shape, spacing, target))
    voxels = math.prod(out)
    if voxels > MAX_RESAMPLED_VOXELS:
        raise DataError(
            f"resampling {tuple(shape)} voxels at spacing {tuple(spacing)} mm to {tuple(target)} mm gives "
            f"{out} = {voxels:.3g} voxels ({voxels * 4 / 2**30:.3g} GiB per float32 channel; at most "
            f"{MAX_RESAMPLED_VOXELS:.3g} voxels): check the spacing's unit, or choose a coarser target spacing"
        )
    return out


def resample_image(image: np.ndarray, shape: Sequence[int], order: int = 3) -> np.ndarray:
    """``(C, D, H, W)`` or ``(D, H, W)`` float intensities -> the same at ``shape``, float32: a cubic
    B-spline (``order=3``, nnU-Net's choice for images; ``1``: trilinear) through SciPy's ``zoom`` on
    the grid of voxel corners (``grid_mode=True``: the field of view is kept, like PyTorch's
    ``align_corners=False``), edges extended by their nearest voxel."""
    import scipy.ndimage as ndi

    shape = tuple(int(n) for n in shape)
    if tuple(image.shape[-3:]) == shape:
        return image.astype(np.float32, copy=False)

    def one(volume: np.ndarray) -> np.ndarray:
        zoom = [a / b for a, b in zip(shape, volume.shape)]
        return ndi.zoom(volume.astype(np.float32, copy=False), zoom, order=order, grid_mode=True, mode="nearest")

    return one(image) if image.ndim == 3 else np.stack([one(channel) for channel in image])


def resample_labels(labels: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """``(D, H, W)`` integer labels -> ``shape``: each class's indicator resampled trilinearly and the
    class with the largest value taken (ties to the smaller class index), so that thin structures
    survive better than with nearest neighbour; the dtype is kept."""
    shape = tuple(int(n) for n in shape)
    if tuple(labels.shape) == shape:
        return labels
    source = torch.from_numpy(np.ascontiguousarray(labels).astype(np.int64))
    best = torch.full(shape, -1.0)
    out = torch.zeros(shape, dtype=torch.int64)
    for cls in torch.unique(source).tolist():
        indicator = (source == cls).float()[None, None]
        value = F.interpolate(indicator, size=shape, mode="trilinear", align_corners=False)[0, 0]
        better = value > best
        out[better], best = cls, torch.where(better, value, best)
    return out.numpy().astype(labels.dtype)


def read_spacing(path: str | Path) -> tuple[float, ...]:
    """A volume file's voxel spacing ``(D, H, W)`` in mm from its header alone (no voxels are read);
    ``.npy`` files carry none: ``(1.0, 1.0, 1.0)``.

    Raises:
        DataError: a file that is not there or whose header does not read.
    """
    path = Path(path)
    if path.name.endswith(".npy"):
        return (1.0, 1.0, 1.0)
    try:
        zooms = _raw_header(path).get_zooms()[:3]
    except DataError:
        raise
    except Exception as exc:  # nibabel raises many kinds for a damaged header
        raise DataError(f"{path}: unreadable volume header ({type(exc).__name__}: {exc})") from None
    spacing = tuple(float(f"{float(z):.6g}") for z in zooms)[::-1]  # float32 headers
    return check_spacing(spacing, f"{path}: the header's voxel spacing", axes=None, error=DataError)


def _raw_header(path: Path):
    """The NIfTI-1 or NIfTI-2 header of ``path`` as written: ``nibabel.load`` would repair a zero or
    negative spacing (to 1 or its absolute value) with only a log line, and the voxels would then be
    resampled at a spacing nobody chose."""
    import nibabel as nib
    from nibabel.openers import ImageOpener

    with ImageOpener(str(path)) as f:
        first = f.read(4)
        sizes = {int.from_bytes(first, "little"), int.from_bytes(first, "big")}  # either byte order
        for klass in (nib.Nifti1Header, nib.Nifti2Header):
            if klass.sizeof_hdr in sizes:
                f.seek(0)
                return klass.from_fileobj(f, check=False)
    raise DataError(f"{path}: not a NIfTI-1 or NIfTI-2 file (its header does not start with size 348 or 540)")


def median_spacing(spacings: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """The per-axis median of the cases' spacings (nnU-Net's default target spacing).

    >>> median_spacing([(5.0, 0.8, 0.8), (2.5, 0.7, 0.7), (3.0, 0.9, 0.9)])
    (3.0, 0.8, 0.8)
    """
    return tuple(float(v) for v in np.median(np.asarray(spacings, dtype=np.float64), axis=0))


def cached_resampled_case(
    image_path: Path,
    label_path: Path,
    load,
    target: Sequence[float],
    cache_dir: str | Path | None,
) -> tuple[np.ndarray, np.ndarray]:
    """A case resampled to ``target``, computed once and kept in the cache (keyed by both files'
    paths, sizes and modification times and the target), so later epochs and runs read it back.
    ``load()`` returns the case's ``(C, D, H, W)`` image, ``(D, H, W)`` labels and spacing."""
    from upzoo.data.cache import cached

    def identity(path: Path) -> list:
        stat = path.stat()
        return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]

    params = {"image": identity(image_path), "label": identity(label_path), "target": list(target), "version": 1}

    def write(root: Path) -> None:
        image, labels, spacing = load()
        shape = resampled_shape(labels.shape, spacing, target)
        root.mkdir(parents=True, exist_ok=True)
        np.save(root / "image.npy", resample_image(image, shape))
        np.save(root / "label.npy", resample_labels(labels, shape))

    root = cached("resampled", params, cache_dir, write)
    return np.load(root / "image.npy"), np.load(root / "label.npy")
