"""Real anatomy, offline: the MNI ICBM152 2009 (symmetric, nonlinear) T1 template and its grey- and
white-matter probability maps at 1 mm, as nilearn's wheel ships them (nothing is downloaded), with
a tissue label map, a split that does not leak, and thick slices made as a scanner makes them.

Arrays are ``(D, H, W)`` = NIfTI ``(z, y, x)`` (upzoo's volume convention: the axial slice axis
first), with a 4x4 affine that maps ``(z, y, x)`` voxel indices to RAS millimetres.

* **Labels** (:func:`tissue_labels`): outside the brain (T1 = 0: the template is skull-stripped)
  ``0`` background; inside, the largest of the probabilities ``(1 - p_gm - p_wm, p_gm, p_wm)``:
  ``1`` CSF and other brain tissue, ``2`` grey matter, ``3`` white matter.
* **Split** (:func:`coronal_split`): the template is left-right symmetric by construction, so a
  hemisphere split would evaluate on a mirror of the training data. The validation block is a
  coronal slab (a range of the anterior-posterior axis ``H``, every axial slice); training takes the
  anterior and posterior rest, apart from a gap on each side.

Thick slices of it are made by :mod:`upzoo.data.slabs`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from upzoo.errors import ConfigError, DataError, ShapeError

__all__ = [
    "MNI152_FILES",
    "TISSUE_NAMES",
    "Brain",
    "mni152_paths",
    "mni152_root",
    "load_mni152",
    "tissue_labels",
    "coronal_split",
]

MNI152_FILES = {
    "t1": "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
    "gm": "mni_icbm152_gm_tal_nlin_sym_09a_converted.nii.gz",
    "wm": "mni_icbm152_wm_tal_nlin_sym_09a_converted.nii.gz",
}
TISSUE_NAMES = ("background", "csf_other", "grey_matter", "white_matter")


@dataclass(frozen=True)
class Brain:
    """The template on its 1 mm grid: ``t1`` float32 in [0, 1], ``labels`` uint8 (:data:`TISSUE_NAMES`),
    ``mask`` (the brain), ``affine`` of the ``(D, H, W)`` array, ``spacing`` in mm."""

    t1: np.ndarray
    labels: np.ndarray
    mask: np.ndarray
    affine: np.ndarray
    spacing: tuple[float, float, float]


def mni152_paths() -> dict[str, Path]:
    """The template's files inside the installed nilearn package (nilearn is not imported).

    Raises:
        ConfigError: nilearn not installed (the pip command), or installed without the files.
    """
    spec = importlib.util.find_spec("nilearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the MNI152 template ships inside nilearn's wheel, which is not installed; pip install 'upzoo[mni152]' "
            "(or pip install nilearn)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data"
    paths = {key: folder / name for key, name in MNI152_FILES.items()}
    missing = [p.name for p in paths.values() if not p.is_file()]
    if missing:
        raise ConfigError(f"nilearn is installed without {', '.join(missing)}; pip install --force-reinstall nilearn")
    return paths


def mni152_root() -> Path:
    """The folder of the template's files (see :func:`mni152_paths`)."""
    return mni152_paths()["t1"].parent


def _read(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A NIfTI file as a ``(D, H, W)`` float32 array scaled to [0, 1] and the affine of that array."""
    import nibabel as nib

    image = nib.load(str(path))
    xyz = np.asarray(image.dataobj, dtype=np.float32)
    scale = 255.0 if image.get_data_dtype() == np.uint8 else max(float(xyz.max()), 1e-12)
    flip = np.eye(4)[[2, 1, 0, 3]]  # (z, y, x, 1) -> (x, y, z, 1)
    return np.ascontiguousarray(xyz.transpose(2, 1, 0)) / scale, image.affine @ flip


def load_mni152() -> Brain:
    """The T1 template, its brain mask and tissue labels (see the module's rule), 1 mm isotropic.

    Raises:
        ConfigError: nilearn missing. DataError: a file that does not read as the template.
    """
    paths = mni152_paths()
    try:
        (t1, affine), (gm, _), (wm, _) = (_read(paths[key]) for key in ("t1", "gm", "wm"))
    except Exception as exc:  # nibabel raises many kinds for a damaged file
        raise DataError(
            f"the MNI152 template in {paths['t1'].parent} does not read ({type(exc).__name__}: {exc})"
        ) from None
    if not t1.shape == gm.shape == wm.shape:
        raise DataError(f"the MNI152 files disagree in shape: T1 {t1.shape}, GM {gm.shape}, WM {wm.shape}")
    mask = t1 > 0
    spacing = tuple(float(v) for v in np.linalg.norm(affine[:3, :3], axis=0))
    return Brain(t1, tissue_labels(gm, wm, mask), mask, affine, spacing)  # type: ignore[arg-type]


def tissue_labels(gm: np.ndarray, wm: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Labels from probability maps in [0, 1]: 0 outside ``mask``; inside, 1 + the argmax of
    ``(1 - gm - wm, gm, wm)`` (CSF/other, grey matter, white matter; ties to the first).

    Raises:
        ShapeError: maps of other shapes. DataError: probabilities outside [0, 1], or a class with no voxel.
    """
    if not gm.shape == wm.shape == mask.shape:
        raise ShapeError(f"tissue_labels: gm {gm.shape}, wm {wm.shape} and mask {mask.shape} must have one shape")
    for name, p in (("gm", gm), ("wm", wm)):
        if not (np.isfinite(p).all() and p.min() >= 0 and p.max() <= 1):
            raise DataError(f"tissue_labels: {name} must be probabilities in [0, 1], got [{p.min()}, {p.max()}]")
    stacked = np.stack([np.clip(1 - gm - wm, 0, 1), gm, wm])
    labels = np.where(mask, 1 + stacked.argmax(0), 0).astype(np.uint8)
    counts = np.bincount(labels.ravel(), minlength=len(TISSUE_NAMES))
    empty = [TISSUE_NAMES[k] for k in range(len(TISSUE_NAMES)) if counts[k] == 0]
    if empty:
        raise DataError(f"tissue_labels: the rule gives no voxel of {', '.join(empty)}; check the maps and the mask")
    return labels


def coronal_split(length: int, *, val_fraction: float = 0.25, gap: int = 8) -> tuple[list[slice], slice]:
    """Training and validation ranges of the anterior-posterior axis (``H``): the validation block of
    ``val_fraction`` of the axis in the middle, and the training blocks before and after it, ``gap``
    voxels away on each side.

    Raises:
        ConfigError: a fraction outside (0, 0.8], a gap that is negative or not whole, or one that leaves
            a training block empty.
    """
    if not (isinstance(val_fraction, (int, float)) and 0 < val_fraction <= 0.8):
        raise ConfigError(f"coronal_split: val_fraction must be in (0, 0.8], got {val_fraction!r}")
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
        raise ConfigError(
            f"coronal_split: gap must be a whole number of voxels >= 0 (a negative one leaks), got {gap!r}"
        )
    size = max(1, round(length * val_fraction))
    start = (length - size) // 2
    val = slice(start, start + size)
    train = [slice(0, start - gap), slice(start + size + gap, length)]
    if any(s.stop - s.start < 1 for s in train):
        raise ConfigError(f"coronal_split: a gap of {gap} leaves no training block of {length} slices")
    return train, val
