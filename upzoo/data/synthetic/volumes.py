"""Synthetic anisotropic volumes (default 5.0 x 0.8 x 0.8 mm) with ellipsoid "organs" of three
classes, noise and a smooth bias field, as NIfTI files in a decathlon-style folder with
``dataset.json``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from upzoo.data.cache import cached

__all__ = ["ORGAN_NAMES", "organ_volume", "ensure_synthetic_volumes"]

# -- volumes -----------------------------------------------------------------------------------------
ORGAN_NAMES = ("background", "liver", "kidney", "spleen")


def organ_volume(
    rng: np.random.Generator,
    shape: Sequence[int],
    spacing: Sequence[float],
    min_thickness_mm: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One synthetic CT-like volume ``(D, H, W)`` float32 (Hounsfield-like units) and its uint8 labels.

    The organs are drawn in millimetres, so one ``rng`` seed gives the same anatomy on any grid of
    the same extent (``shape * spacing``) once ``min_thickness_mm`` (the smallest organ half-height,
    by default 2.5 slices: ``2.5 * spacing[0]``) is fixed; only the noise differs."""
    d, h, w = (int(s) for s in shape)
    zz, yy, xx = np.meshgrid(*(np.arange(n) * sp for n, sp in zip((d, h, w), spacing)), indexing="ij")
    extent = np.array([d, h, w]) * np.asarray(spacing)
    body = ((zz - extent[0] / 2) / (extent[0] * 0.7)) ** 2 + ((yy - extent[1] / 2) / (extent[1] * 0.42)) ** 2 + (
        (xx - extent[2] / 2) / (extent[2] * 0.45)
    ) ** 2 < 1
    vol = np.where(body, 20.0, -900.0)
    labels = np.zeros((d, h, w), np.uint8)
    means = {1: 60.0, 2: 110.0, 3: 45.0}
    for cls, (scale, count) in {1: (0.22, 1), 2: (0.09, 2), 3: (0.12, 1)}.items():
        for _ in range(count):
            center = extent * rng.uniform(0.3, 0.7, 3)
            radii = extent.max() * scale * rng.uniform(0.7, 1.3, 3)
            radii[0] = max(radii[0], min_thickness_mm or 2.5 * spacing[0])  # at least a few slices thick
            inside = ((zz - center[0]) / radii[0]) ** 2 + ((yy - center[1]) / radii[1]) ** 2 + (
                (xx - center[2]) / radii[2]
            ) ** 2 < 1
            inside &= body
            labels[inside] = cls
            vol[inside] = means[cls] + rng.normal(0, 8)
    bias = 1.0 + 0.15 * np.cos(zz / extent[0] * np.pi * rng.uniform(0.5, 1.5)) * np.sin(yy / extent[1] * np.pi)
    vol = vol * bias + rng.normal(0, 15, vol.shape)
    return vol.astype(np.float32), labels


def ensure_synthetic_volumes(
    cache_dir: str | Path | None = None,
    *,
    train: int = 12,
    val: int = 4,
    shape: Sequence[int] = (24, 96, 96),
    spacing: Sequence[float] = (5.0, 0.8, 0.8),
    seed: int = 0,
) -> Path:
    """The embedded volume set as NIfTI files in a decathlon-style folder (``imagesTr``, ``labelsTr``,
    ``dataset.json``), generated once. The last ``val`` cases form the validation split."""
    from upzoo.data.volumes import write_nifti

    params = {"train": train, "val": val, "shape": list(shape), "spacing": list(spacing), "seed": seed, "version": 1}

    def write(root: Path) -> None:
        entries = []
        for i in range(train + val):
            rng = np.random.default_rng([seed, i])
            volume, labels = organ_volume(rng, shape, spacing)
            name = f"synth_{i:03d}.nii.gz"
            write_nifti(root / "imagesTr" / name, volume, spacing)
            write_nifti(root / "labelsTr" / name, labels, spacing)
            entries.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
        (root / "dataset.json").write_text(
            json.dumps(
                {
                    "name": "upzoo synthetic organs",
                    "modality": {"0": "CT"},
                    "labels": {str(i): n for i, n in enumerate(ORGAN_NAMES)},
                    "numTraining": len(entries),
                    "training": entries,
                    "validation_count": val,
                },
                indent=2,
            )
        )

    return cached("volumes-synthetic", params, cache_dir, write)
