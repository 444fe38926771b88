"""Tissue segmentation from thick slices: cross-entropy + Dice between the network's thin-grid logits
and the thin tissue labels of the MNI152 brain, evaluated on the held-out coronal block: Dice, HD95
and surface Dice (1 mm tolerance) per tissue on the 1 mm grid, beside two references: the **oracle**
thick-grid labels (``oracle_*``: each slab's most frequent *true* label, repeated onto its thin
slices — it reads the held-out labels, and it maximises the voxels labelled right, not each tissue's
Dice) and a **label-free** baseline (``kmeans_*``: :func:`~upzoo.train.tissue_baseline.kmeans_tissue_labels`,
intensity classes of the cubic-interpolated thick slices fitted on the training blocks)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from upzoo.data.mni152 import TISSUE_NAMES
from upzoo.metrics.confusion import ConfusionMatrix
from upzoo.metrics.surface import SurfaceMetrics
from upzoo.models import build_model
from upzoo.train.context import StepContext
from upzoo.train.tasks import Task, segmentation_loss
from upzoo.train.through_plane import through_plane_planes

if TYPE_CHECKING:
    from upzoo.prepare import Prepared

__all__ = ["ThroughPlaneSegmentationTask", "tissue_scores", "thick_grid_labels", "evaluate_tissue_block"]

TOLERANCE_MM = 1.0  # the surface Dice's tolerance: one thin voxel (the cortex is 2-4 mm thick)
TISSUES = TISSUE_NAMES[1:]  # the foreground classes scored (background is not a tissue)
SHORT = {"csf_other": "csf", "grey_matter": "gm", "white_matter": "wm"}


def tissue_scores(pred: np.ndarray, labels: np.ndarray, spacing=(1.0, 1.0, 1.0)) -> dict[str, float]:
    """Dice, HD95 (mm) and surface Dice (at :data:`TOLERANCE_MM`) of label maps ``(D, H, W)`` per tissue
    (``gm_dice``, ``gm_hd95``, ...) and their means over the three tissues (``dice``, ``hd95``,
    ``surface_dice``)."""
    k = len(TISSUE_NAMES)
    confusion = ConfusionMatrix(k, sync_on_compute=False)
    confusion.update(torch.from_numpy(pred), torch.from_numpy(labels))
    surface = SurfaceMetrics(k, tolerance_mm=TOLERANCE_MM, sync_on_compute=False)
    surface.update(torch.from_numpy(pred), torch.from_numpy(labels), list(spacing))
    per_class = {**confusion.compute(), **surface.compute()}
    scores = {}
    for key in ("dice", "hd95", "surface_dice"):
        values = per_class[f"per_class_{key}"]
        scores.update({f"{SHORT[name]}_{key}": float(values[c]) for c, name in enumerate(TISSUE_NAMES) if c})
        scores[key] = float(np.mean([values[c] for c in range(1, k)]))
    return scores


def thick_grid_labels(labels: np.ndarray, factor: int) -> np.ndarray:
    """Each ``factor``-slice slab's most frequent label per column (ties to the lower label), repeated
    onto its thin slices: the best labelling of the thick grid, at the thin grid."""
    d, h, w = labels.shape
    slabs = labels.reshape(d // factor, factor, h, w)
    counts = np.stack([(slabs == c).sum(1) for c in range(len(TISSUE_NAMES))])
    return np.repeat(counts.argmax(0).astype(labels.dtype), factor, axis=0)


@torch.no_grad()
def evaluate_tissue_block(
    model: nn.Module, dataset: Any, device: torch.device, precision: Any, baselines: dict | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The held-out block labelled whole by ``model`` on the thin grid: its scores, the references'
    (``oracle_*``: :func:`thick_grid_labels`; ``kmeans_*``: the label-free baseline; or ``baselines``,
    which do not change during a run), and the volumes for the figure."""
    was_training = model.training
    model.eval()
    try:
        item = dataset[0]
        with precision():
            logits = model(item["image"][None].to(device))
        pred = logits.float().max(1).indices[0].cpu().numpy().astype(np.int64)
    finally:
        model.train(was_training)
    labels, thick = item["labels"].numpy(), item["image"][0].numpy()
    factor = labels.shape[0] // thick.shape[0]
    thick_labels = thick_grid_labels(labels, factor)
    if baselines is None:
        baselines = reference_scores(dataset.volume, labels, thick_labels)
    metrics = {**tissue_scores(pred, labels), **baselines}
    metrics.update(block=item["name"], voxels=int(labels.size), factor=factor)
    volumes = {"input": np.repeat(thick, factor, 0), "reference_t1": item["target"][0].numpy(), "network": pred,
               "thick_labels": thick_labels, "reference": labels, "mask": item["mask"].numpy()}  # fmt: skip
    return metrics, volumes


def reference_scores(volume: Any, labels: np.ndarray, oracle: np.ndarray) -> dict[str, float]:
    """The oracle's and the label-free baseline's scores on the held-out block (``oracle_*``, ``kmeans_*``)."""
    from upzoo.train.tissue_baseline import kmeans_tissue_labels

    scores = {f"oracle_{k}": v for k, v in tissue_scores(oracle, labels).items()}
    kmeans = kmeans_tissue_labels(volume).astype(np.int64)
    return scores | {f"kmeans_{k}": v for k, v in tissue_scores(kmeans, labels).items()}


def _contours(image: np.ndarray, labels: np.ndarray) -> torch.Tensor:
    """``image`` in grey with the outlines of grey matter (red) and white matter (blue) of ``labels``."""
    tile = np.repeat(np.clip(image, 0, 1)[None], 3, 0)
    for label, colour in ((2, (1.0, 0.15, 0.15)), (3, (0.2, 0.6, 1.0))):
        inside = np.pad(labels == label, 1, mode="edge")
        core = inside[1:-1, 1:-1]
        edge = core & ~(inside[:-2, 1:-1] & inside[2:, 1:-1] & inside[1:-1, :-2] & inside[1:-1, 2:])
        tile[:, edge] = np.array(colour)[:, None]
    return torch.from_numpy(np.ascontiguousarray(tile, dtype=np.float32))


def tissue_figure(volumes: dict[str, np.ndarray], metrics: dict[str, Any], path: Any) -> None:
    """Coronal and sagittal planes: the thick input, and over the 1 mm T1 the outlines of the thick-grid
    labels, the network's and the reference's (grey matter red, white matter blue)."""
    from upzoo.figures import titled_grid

    columns = ["input (thick slices)", "oracle thick-grid labels", "network", "reference labels"]
    captions = ["", f"GM Dice {metrics['oracle_gm_dice']:.3f}", f"GM Dice {metrics['gm_dice']:.3f}", ""]
    rows = []
    planes = {key: through_plane_planes(volumes[key], volumes["mask"]) for key in
              ("input", "reference_t1", "thick_labels", "network", "reference")}  # fmt: skip
    for plane in (0, 1):
        cut = {key: np.ascontiguousarray(value[plane]) for key, value in planes.items()}
        tiles = [torch.from_numpy(cut["input"])[None], *(_contours(cut["reference_t1"], cut[key])
                 for key in ("thick_labels", "network", "reference"))]  # fmt: skip
        rows.append(list(zip(tiles, captions)))
    title = (f"{metrics['block']}: coronal (top) and sagittal (bottom) planes, labels from x{metrics['factor']} "
             f"thicker slices\noutlines over the 1 mm T1: grey matter red, white matter blue")  # fmt: skip
    titled_grid(rows, columns, path, title=title)


class ThroughPlaneSegmentationTask(Task):
    """Cross-entropy + Dice on thick-slice patches against their thin labels; evaluated on the held-out
    block (Dice, HD95, surface Dice per tissue), ``best.pt`` by the mean Dice over the three tissues;
    ``predictions.png`` shows the outlines in the coronal and sagittal planes."""

    kind = "through_plane_segmentation"
    eval_columns = ["val_dice", "val_gm_dice", "val_wm_dice", "val_csf_dice", "val_hd95", "val_gm_hd95",
                    "val_surface_dice"]  # fmt: skip
    curve_columns = ["val_dice", "val_gm_dice", "val_csf_dice"]
    step_columns = ["loss"]
    best_key = "val_dice"

    def __init__(self, prepared: Prepared) -> None:
        super().__init__(prepared)
        self.modules = {"model": build_model(prepared.spec)}
        self.last: dict[str, Any] = {}
        self.baselines: dict[str, float] | None = None  # the references' scores, from the first evaluation

    def step(self, batch: dict, ctx: StepContext) -> dict[str, float]:
        images, labels = ctx.to_device(batch["image"], image=True), ctx.to_device(batch["mask"])
        with ctx.autocast():
            output = ctx.net("model")(images)
        loss = segmentation_loss(output, labels, kind=self.prepared.recipe.train.loss, ignore_index=255,
                                 num_classes=len(TISSUE_NAMES))  # fmt: skip
        return {"loss": ctx.optimize(loss, "model")}

    def evaluate(self, ctx: StepContext) -> dict[str, float]:
        metrics, volumes = evaluate_tissue_block(
            self.modules["model"], self.prepared.data.val, ctx.device, ctx.autocast, self.baselines
        )
        self.last = metrics
        self.baselines = {k: v for k, v in metrics.items() if k.startswith(("oracle_", "kmeans_"))}
        self.curve_baselines = {  # the label-free baseline to pass, and the oracle's ceiling
            f"val_{k}": [("label-free k-means", metrics[f"kmeans_{k}"]), ("oracle", metrics[f"oracle_{k}"])]
            for k in ("dice", "gm_dice", "csf_dice")
        }
        if ctx.is_main:
            tissue_figure(volumes, metrics, ctx.run_path / "predictions.png")
        return {column: metrics[column[4:]] for column in self.eval_columns}

    def summary(self, last: dict[str, float], best: float | None) -> dict[str, Any]:
        return {"last_loss": last.get("loss", float("nan")), "val": self.last, "best_dice": best}
