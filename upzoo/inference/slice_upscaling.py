"""``upscale_volume_files``: a through-plane run over thick-slice NIfTI volumes (``upzoo predict`` on
a ``through_plane_sr`` or ``through_plane_segmentation`` run): ``OUT/NAME.nii.gz`` on the thin grid
(the thin volume, float32; or the tissue labels, uint8), and ``predictions.csv``.

The slice axis is NIfTI's third voxel axis (``k``, upzoo's ``D``). Intensities are scaled to [0, 1]
as the training volume was, and back: by 255 for uint8 files; a float file by its maximum over the
thick training volume's maximum (the run's ``thick_peak``: training divides by the *thin*
volume's maximum, which averaging into slabs lowers; 0.935 on the template), so the template's own
thick slices are scaled exactly as in training. ``predictions.csv`` gives shapes in nibabel's
axis order (``i x j x k``). The
output's affine is the thin grid's (:func:`~upzoo.data.slabs.thin_affine`): voxels ``factor`` times
shorter along the slice axis, the first thin slice at the bottom of the first thick one, so the
output lies where the input does in scanner space (nibabel and nilearn read it back on that grid).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from upzoo.data.slabs import thin_affine
from upzoo.errors import ConfigError, DataError, UpzooError
from upzoo.inference.file_upscaling import write_csv
from upzoo.inference.files import named_inputs
from upzoo.inference.run import planned_outputs
from upzoo.runs.trained_model import LoadedModel
from upzoo.runtime import FolderLock, atomic_write, autocast, terminate_as_interrupt

__all__ = ["upscale_volume_files", "upscale_volume", "label_volume", "SLAB_TOLERANCE"]

SLAB_TOLERANCE = 0.05  # the input's slice-to-in-plane spacing ratio may differ this much from the model's factor


def _read(path: Path, factor: int, thick_peak: float) -> tuple[np.ndarray, float, Any]:
    """``(D, H, W)`` in [0, 1], the intensity scale, the nibabel image.

    Raises:
        DataError: not a 3D volume, or slices whose spacing is not ``factor`` times the in-plane one
            (naming the axis that is thick where it is not NIfTI's third).
        ConfigError: an affine that is not axis-aligned.
    """
    from upzoo.data.volumes import read_nifti

    array, spacing, image = read_nifti(path)
    if array.ndim != 3:
        raise DataError(f"{path}: a through-plane model takes a 3D volume, got shape {array.shape}")
    _check_slab_axis(path, spacing, factor)
    thin_affine(image.affine, factor, axis=2)  # axis-aligned, or one line
    scale = 255.0 if image.get_data_dtype() == np.uint8 else float(array.max()) / thick_peak
    if not math.isfinite(scale) or scale <= 0:
        peak = float(array.max())
        raise DataError(f"{path}: the volume has no positive voxel (maximum {peak:g}); nothing to upsample")
    return array / scale, scale, image


def _check_slab_axis(path: Path, spacing: Sequence[float], factor: int) -> None:
    """Slices ``factor`` times the in-plane spacing apart along NIfTI's third axis (``spacing`` is ``(k, j, i)``)."""
    ratio = spacing[0] / min(spacing[1:])
    if abs(ratio / factor - 1) <= SLAB_TOLERANCE:
        return
    thick_axis = int(np.argmax(spacing))
    if thick_axis != 0 and spacing[thick_axis] / min(spacing) > 1 + SLAB_TOLERANCE:
        name = "ij"[2 - thick_axis]
        raise DataError(
            f"{path}: the thick axis is NIfTI's axis {name} ({spacing[thick_axis]:g} mm; nibabel spacing "
            f"{tuple(round(s, 4) for s in spacing[::-1])}), and the model takes slices along the third axis (k); "
            f"reorient the volume so its thick axis comes third (e.g. nibabel's as_reoriented or fslswapdim)"
        )
    fix = f"use a run trained for ratio {round(ratio)}" if round(ratio) > 1 else "its slices are thin already"
    raise DataError(
        f"{path}: slices {spacing[0]:g} mm apart at {min(spacing[1:]):g} mm in-plane (ratio {ratio:.2f}), and the "
        f"model upsamples slices x{factor} (trained on {factor} mm slices of 1 mm voxels); {fix}"
    )


def training_thick_peak(loaded: LoadedModel) -> float:
    """The run's ``thick_peak``; for runs written before checkpoints held it, made again from the recipe
    (the thick slices are deterministic)."""
    if loaded.thick_peak is not None:
        return float(loaded.thick_peak)
    from upzoo.data.through_plane import thick_slice_volume

    data = loaded.recipe.data
    return float(thick_slice_volume(data.slice_thickness, data.slice_noise, data.synthetic_seed).thick.max())


@torch.no_grad()
def _forward(model: torch.nn.Module, volume: np.ndarray, device: torch.device, amp: bool) -> torch.Tensor:
    """The model's output on ``(D, H, W)`` in [0, 1], the volume whole, in float32 on the CPU."""
    model.eval()
    x = torch.from_numpy(np.ascontiguousarray(volume, dtype=np.float32))[None, None].to(device)
    with autocast("bf16" if amp else "none", device, "--amp"):
        return model(x).float().cpu()


def upscale_volume(model: torch.nn.Module, volume: np.ndarray, device: torch.device, amp: bool = False) -> np.ndarray:
    """``(D, H, W)`` in [0, 1] -> ``(D * s_d, H * s_h, W * s_w)`` clipped to [0, 1], the volume whole."""
    return _forward(model, volume, device, amp).clamp(0, 1)[0, 0].numpy()


def label_volume(model: torch.nn.Module, volume: np.ndarray, device: torch.device, amp: bool = False) -> np.ndarray:
    """``(D, H, W)`` thick slices in [0, 1] -> uint8 labels ``(D * s_d, H * s_h, W * s_w)`` (the argmax of the
    thin-grid logits), the volume whole."""
    return _forward(model, volume, device, amp).max(1).indices[0].numpy().astype(np.uint8)


def _write(path: Path, thin: np.ndarray, image: Any, factor: int) -> None:
    import nibabel as nib

    affine = thin_affine(image.affine, factor, axis=2)
    header = image.header.copy()
    header.set_data_dtype(thin.dtype)
    if thin.dtype == np.uint8:  # labels: no intensity scaling
        header.set_slope_inter(1, 0)
    out = nib.Nifti1Image(np.ascontiguousarray(thin.transpose(2, 1, 0)), affine, header)
    out.set_qform(affine, code=int(image.header["qform_code"]) or 1)
    out.set_sform(affine, code=int(image.header["sform_code"]) or 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: nib.save(out, str(tmp)))


def upscale_volume_files(
    loaded: LoadedModel, inputs: Sequence[str | Path], out: Path, *, device: torch.device | str = "cpu",
    amp: bool = False, overwrite: bool = False, keep_going: bool = False, progress: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Upsample (or label, on the thin grid) every input volume's slices into ``out``; returns
    ``{written, failed, csv, seconds}``.

    Raises:
        DataError: an unreadable input or one whose slices do not fit the model (with ``keep_going``
            listed in ``failed``), outputs that exist without ``overwrite``. ConfigError: a run of another task.
    """
    if loaded.task not in ("through_plane_sr", "through_plane_segmentation"):
        raise ConfigError(
            f"{loaded.checkpoint} is a {loaded.task} run; upscale_volume_files takes a through_plane_sr or "
            f"through_plane_segmentation run"
        )
    start = time.perf_counter()
    named = named_inputs(inputs, volumes=True, exclude=out)
    lock = FolderLock(out, f"another upzoo predict is writing into {out}; wait for it or choose another --out",
                      name=".predict.lock", transient=True)  # fmt: skip
    with lock, terminate_as_interrupt():
        planned = planned_outputs(named, out, overwrite, lambda name: {"volume": out / f"{name}.nii.gz"})
        rows, failed = _run(loaded, named, planned, torch.device(device), amp, keep_going, progress)
        write_csv(out / "predictions.csv", rows)
    return {"written": len(rows), "failed": failed, "csv": str(out / "predictions.csv"),
            "seconds": round(time.perf_counter() - start, 3)}  # fmt: skip


def _run(loaded, named, planned, device, amp, keep_going, progress) -> tuple[list, list]:
    from tqdm import tqdm

    factor, peak = int(loaded.spec.options["scale"][0]), training_thick_peak(loaded)
    rows, failed = [], []
    for (path, _), outputs in tqdm(list(zip(named, planned)), desc="upsample", unit="volume", disable=not progress):
        try:
            volume, scale, image = _read(path, factor, peak)
        except UpzooError as exc:
            if not keep_going:
                raise DataError(f"{exc} (--keep-going skips such files)") from None
            failed.append((str(path), str(exc)))
            continue
        began = time.perf_counter()
        if loaded.task == "through_plane_segmentation":
            thin = label_volume(loaded.model, volume, device, amp)
        else:
            thin = (upscale_volume(loaded.model, volume, device, amp) * scale).astype(np.float32)
        _write(outputs["volume"], thin, image, factor)
        shapes = {
            "input_shape": "x".join(map(str, volume.shape[::-1])),
            "output_shape": "x".join(map(str, thin.shape[::-1])),
        }  # nibabel's i x j x k
        rows.append({"file": str(path), "output": str(outputs["volume"]), **shapes,
                     "seconds": round(time.perf_counter() - began, 4)})  # fmt: skip
    return rows, failed
