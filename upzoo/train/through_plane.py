"""The through-plane super-resolution task: L1 between the network's thin slices and the thin
patch, evaluated on the held-out coronal block of the MNI152 brain as a volume is: PSNR and 3D SSIM
over the brain's voxels only (:mod:`upzoo.metrics.volume_quality`), beside the interpolations a
learned upsampler has to beat (linear, cubic convolution, cubic B-spline; :mod:`upzoo.data.slabs`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from upzoo.data.slabs import SLICE_INTERPOLATIONS, interpolate_slices
from upzoo.metrics.volume_quality import masked_psnr, masked_ssim
from upzoo.models import build_model
from upzoo.train.context import StepContext
from upzoo.train.tasks import Task

if TYPE_CHECKING:
    from upzoo.prepare import Prepared

__all__ = ["ThroughPlaneTask", "evaluate_through_plane", "volume_scores", "baseline_scores", "through_plane_planes"]

METRICS = ("psnr", "ssim")


def volume_scores(output: np.ndarray, target: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """PSNR (dB) and 3D SSIM of ``output`` against ``target`` inside ``mask`` (data range 1)."""
    return {"psnr": masked_psnr(output, target, mask), "ssim": masked_ssim(output, target, mask)}


def baseline_scores(thick: np.ndarray, target: np.ndarray, mask: np.ndarray, factor: int) -> dict[str, float]:
    """Each interpolation of :data:`~upzoo.data.slabs.SLICE_INTERPOLATIONS`, clipped to [0, 1], scored
    as the network is: ``{"linear_psnr", "linear_ssim", "cubic_psnr", ...}``."""
    scores = {}
    for method in SLICE_INTERPOLATIONS:
        thin = np.clip(interpolate_slices(thick, factor, method), 0, 1)
        scores.update({f"{method}_{k}": v for k, v in volume_scores(thin, target, mask).items()})
    return scores


def through_plane_planes(volume: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The coronal plane ``(D, W)`` and the sagittal plane ``(D, H)`` through the brain's centre of
    ``volume`` ``(D, H, W)``, superior up (the slice axis is where thick slices show as staircases)."""
    centre = np.argwhere(mask).mean(0).round().astype(int)
    return volume[::-1, centre[1], :], volume[::-1, :, centre[2]]


@torch.no_grad()
def evaluate_through_plane(
    model: nn.Module, dataset: Any, device: torch.device, precision: Callable, baselines: dict | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The held-out block upscaled whole by ``model``, clipped to [0, 1]: its scores and the
    interpolations' (:func:`baseline_scores`, or ``baselines`` when given: they do not change during
    a run), and the volumes for the figure (``input`` nearest-upscaled, ``linear``, ``network``,
    ``reference``, ``mask``)."""
    was_training = model.training
    model.eval()
    try:
        item = dataset[0]
        with precision():
            output = model(item["image"][None].to(device)).float().cpu()[0, 0].clamp(0, 1).numpy()
    finally:
        model.train(was_training)
    thick, target, mask = item["image"][0].numpy(), item["target"][0].numpy(), item["mask"].numpy()
    factor = target.shape[0] // thick.shape[0]
    metrics = {**volume_scores(output, target, mask), **(baselines or baseline_scores(thick, target, mask, factor))}
    metrics.update(block=item["name"], voxels=int(mask.sum()), factor=factor)
    volumes = {"input": np.repeat(thick, factor, 0), "linear": np.clip(interpolate_slices(thick, factor), 0, 1),
               "network": output, "reference": target, "mask": mask}  # fmt: skip
    return metrics, volumes


def best_interpolation(metrics: dict[str, Any], key: str) -> tuple[str, float]:
    """The strongest interpolation baseline on ``key`` and its value (the B-spline on the template): the
    line a curve must pass, and what a run's last line states its gain against."""
    names = {"linear": "linear", "cubic": "cubic", "bspline": "B-spline"}
    best = max(names, key=lambda m: metrics[f"{m}_{key}"])
    return names[best], metrics[f"{best}_{key}"]


def through_plane_figure(volumes: dict[str, np.ndarray], metrics: dict[str, Any], path: Any) -> None:
    """Coronal and sagittal planes of the input, linear interpolation, the network and the reference."""
    from upzoo.figures import titled_grid

    columns = ["input (thick slices)", "linear interpolation", "network", "reference (1 mm)"]
    captions = ["", f"PSNR {metrics['linear_psnr']:.2f} dB (block, brain)", f"PSNR {metrics['psnr']:.2f} dB", ""]
    rows = []
    for plane in (0, 1):
        tiles = [
            through_plane_planes(volumes[k], volumes["mask"])[plane]
            for k in ("input", "linear", "network", "reference")
        ]
        rows.append([(torch.from_numpy(np.ascontiguousarray(t))[None], c) for t, c in zip(tiles, captions)])
    title = f"{metrics['block']}: coronal (top) and sagittal (bottom) planes, x{metrics['factor']} through-plane"
    titled_grid(rows, columns, path, title=title)


class ThroughPlaneTask(Task):
    """L1 on thick/thin patch pairs; evaluated on the held-out block (PSNR and SSIM in the brain),
    ``best.pt`` by PSNR; ``predictions.png`` shows the coronal and sagittal planes."""

    kind = "through_plane_sr"
    eval_columns = [f"val_{k}" for k in METRICS]
    curve_columns = ["val_psnr", "val_ssim"]
    step_columns = ["loss"]
    best_key = "val_psnr"

    def __init__(self, prepared: Prepared) -> None:
        super().__init__(prepared)
        self.modules = {"model": build_model(prepared.spec)}
        self.last: dict[str, Any] = {}
        self.baselines: dict[str, float] | None = None  # the interpolations' scores, measured at the first evaluation

    def step(self, batch: dict, ctx: StepContext) -> dict[str, float]:
        low, target = ctx.to_device(batch["image"], image=True), ctx.to_device(batch["target"], image=True)
        with ctx.autocast():
            output = ctx.net("model")(low)
        return {"loss": ctx.optimize(F.l1_loss(output.float(), target), "model")}

    def evaluate(self, ctx: StepContext) -> dict[str, float]:
        metrics, volumes = evaluate_through_plane(
            self.modules["model"], self.prepared.data.val, ctx.device, ctx.autocast, self.baselines
        )
        self.last = metrics
        self.baselines = {k: v for k, v in metrics.items() if k.split("_")[0] in SLICE_INTERPOLATIONS}
        self.curve_baselines = {f"val_{k}": best_interpolation(metrics, k) for k in METRICS}
        if ctx.is_main:
            through_plane_figure(volumes, metrics, ctx.run_path / "predictions.png")
        return {f"val_{k}": metrics[k] for k in METRICS}

    def summary(self, last: dict[str, float], best: float | None) -> dict[str, Any]:
        return {"last_loss": last.get("loss", float("nan")), "val": self.last, "best_psnr": best}
