"""Segmentation evaluation over a dataset: 2D images whole, 3D volumes by sliding window; metrics
from one dataset-level confusion matrix, summed across DDP ranks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from upzoo.data.loading import iterate_loader
from upzoo.metrics import BoundaryFScore, BoundaryIoU, ConfusionMatrix, SurfaceMetrics
from upzoo.runtime import autocast, main_output
from upzoo.train.distributed import DistContext, ResumableSampler

__all__ = ["evaluate_segmentation"]


@torch.no_grad()
def evaluate_segmentation(
    model: nn.Module,
    dataset: Dataset,
    *,
    num_classes: int,
    ignore_index: int = 255,
    device: torch.device | str = "cpu",
    amp: str = "none",
    ctx: DistContext | None = None,
    volumes: bool = False,
    patch_size: Sequence[int] | None = None,
    overlap: float = 0.5,
    window_batch: int = 2,
    keep: int = 0,
    num_workers: int = 0,
) -> tuple[dict[str, Any], list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """Metrics of ``model`` on ``dataset`` and up to ``keep`` ``(image, mask, prediction)`` examples.

    Each rank evaluates its share of the samples (no sample twice); the confusion matrices, the
    boundary counts of 2D images (Boundary IoU, boundary F-score) and the per-case HD95 and surface
    Dice sums of volumes (at the volume's spacing) are summed.
    """
    from upzoo.windows import sliding_window_inference

    ctx = ctx or DistContext()
    device = torch.device(device)
    was_training = model.training
    model.eval()
    sampler = ResumableSampler(dataset, shuffle=False, rank=ctx.rank, world_size=ctx.world_size)
    loader = DataLoader(dataset, batch_size=1, sampler=sampler, num_workers=num_workers)
    acc = ConfusionMatrix(num_classes, ignore_index)
    boundaries = [SurfaceMetrics(num_classes)] if volumes else [BoundaryIoU(num_classes, ignore_index)]
    boundaries += [] if volumes else [BoundaryFScore(num_classes, ignore_index)]
    examples = []
    for sample in iterate_loader(loader):
        image = sample["image"].to(device)
        with autocast(amp, device):
            if volumes and patch_size is not None:
                logits = sliding_window_inference(
                    image[0], lambda b: main_output(model(b)), patch_size, overlap=overlap, batch_size=window_batch
                )[None]
            else:
                logits = main_output(model(image))
        pred = logits.float().max(1).indices.cpu()  # the argmax; max(dim) is ~5x faster on the CPU
        acc.update(pred, sample["mask"])
        for boundary in boundaries:
            if volumes:
                boundary.update(pred[0], sample["mask"][0], sample["spacing"][0].tolist())
            else:
                boundary.update(pred, sample["mask"])
        if len(examples) < keep:
            examples.append((sample["image"][0], sample["mask"][0], pred[0]))
    acc.sync()
    metrics = acc.compute()
    for boundary in boundaries:
        boundary.sync()
        metrics.update(boundary.compute())
    model.train(was_training)
    return metrics, examples
