"""The super-resolution task: L1 on bicubic-degraded crops (plus, optionally, SRGAN's adversarial
term), evaluated like a paper (PSNR/SSIM on the Y channel with ``scale`` border pixels cropped, on
8-bit outputs) and beside it the things an upsampler changes: RGB PSNR, the spectral error
against the high-resolution images and the checkerboard score of the outputs."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.data.bicubic import imresize
from upzoo.metrics.checkerboard import image_checkerboard
from upzoo.metrics.image_quality import ImageQuality
from upzoo.metrics.spectrum import empty_rings, radial_power_spectrum, spectral_error
from upzoo.models import build_model
from upzoo.models.pretrained import PerceptualLoss
from upzoo.models.super_resolution import SRDiscriminator
from upzoo.train.context import StepContext
from upzoo.train.tasks import Task

if TYPE_CHECKING:
    from upzoo.prepare import Prepared

__all__ = [
    "SuperResolutionTask",
    "ImageSetScores",
    "evaluate_super_resolution",
    "image_metrics",
    "bicubic_upscale",
]

METRICS = ("psnr_y", "ssim_y", "psnr_rgb", "spectral_error", "checkerboard")


def bicubic_upscale(images: torch.Tensor, scale: int) -> torch.Tensor:
    """MATLAB-bicubic upscaling by ``scale`` (the baseline every SR table starts from), in [0, 1]."""
    height, width = images.shape[-2:]
    return imresize(images, (height * scale, width * scale), float(scale)).clamp(0, 1)


def _square(images: torch.Tensor) -> torch.Tensor:
    side = min(images.shape[-2:]) // 2 * 2
    top, left = (images.shape[-2] - side) // 2, (images.shape[-1] - side) // 2
    return images[..., top : top + side, left : left + side]


class ImageSetScores:
    """The task's metrics over a set of images, one object for SR and one for bicubic: PSNR/SSIM on
    the Y channel and RGB PSNR as :class:`~upzoo.metrics.ImageQuality` measures them (BasicSR's
    convention: ``scale`` border pixels cropped; outputs rounded to 8 bits first, as a saved image
    is), the spectral error (NaN for a target with frequency rings of no power, flat or band-limited
    images: the means skip it) and the checkerboard score. Each rank measures every held-out image,
    so nothing is synced."""

    def __init__(self, scale: int) -> None:
        self.scale = scale
        self.y = ImageQuality(crop_border=scale, y_channel=True, sync_on_compute=False)
        self.rgb = ImageQuality(crop_border=scale, y_channel=False, sync_on_compute=False)
        self.spectral: list[dict[str, float]] = []

    def update(self, output: torch.Tensor, target: torch.Tensor) -> None:
        """One ``(1, C, H, W)`` output against its high-resolution target, both in [0, 1]."""
        output = torch.round(output.clamp(0, 1) * 255.0) / 255.0
        self.y.update(output, target)
        self.rgb.update(output, target)
        real = radial_power_spectrum(_square(target))
        error = math.nan if empty_rings(real).size else spectral_error(radial_power_spectrum(_square(output)), real)[1]
        self.spectral.append({"spectral_error": error, "checkerboard": image_checkerboard(output, period=self.scale)})

    def rows(self) -> list[dict[str, float]]:
        """Per image: ``psnr_y``, ``ssim_y``, ``psnr_rgb``, ``spectral_error``, ``checkerboard``."""
        (psnr_y, ssim_y), (psnr_rgb, _) = self.y.per_image(), self.rgb.per_image()
        return [{"psnr_y": p, "ssim_y": s, "psnr_rgb": r, **extra}
                for p, s, r, extra in zip(psnr_y, ssim_y, psnr_rgb, self.spectral)]  # fmt: skip


def image_metrics(output: torch.Tensor, target: torch.Tensor, scale: int) -> dict[str, float]:
    """:class:`ImageSetScores` of one ``(1, C, H, W)`` output against its target."""
    scores = ImageSetScores(scale)
    scores.update(output, target)
    return scores.rows()[0]


def _means(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each metric's mean over the images where it is defined (NaN where it is nowhere)."""
    means = {}
    for key in METRICS:
        values = [row[key] for row in rows if not math.isnan(row[key])]
        means[key] = math.fsum(values) / len(values) if values else math.nan
    return means


@torch.no_grad()
def evaluate_super_resolution(
    model: nn.Module, dataset: Any, scale: int, device: torch.device, precision: Callable, keep: int = 4
) -> tuple[dict[str, Any], list[tuple[torch.Tensor, ...]]]:
    """Every held-out image of ``dataset`` upscaled whole by ``model`` and by bicubic interpolation:
    the means and the per-image rows of :class:`ImageSetScores`, and ``keep`` (LR, bicubic, SR, HR)
    examples for the figure."""
    was_training = model.training
    model.eval()
    network, bicubic_scores, names, examples = ImageSetScores(scale), ImageSetScores(scale), [], []
    try:
        for index in range(len(dataset)):
            item = dataset[index]
            low, target = item["image"][None], item["target"][None]
            with precision():
                output = model(low.to(device)).float().cpu()
            bicubic = bicubic_upscale(low, scale)
            network.update(output, target)
            bicubic_scores.update(bicubic, target)
            names.append(item["name"])
            if len(examples) < keep:
                examples.append((low[0], bicubic[0], output[0].clamp(0, 1), target[0]))
    finally:
        model.train(was_training)
    theirs = bicubic_scores.rows()
    rows = [{"image": name, **ours, **{f"bicubic_{k}": v for k, v in base.items()}}
            for name, ours, base in zip(names, network.rows(), theirs)]  # fmt: skip
    bicubic = {f"bicubic_{k}": v for k, v in _means(theirs).items()}
    return {**_means(rows), **bicubic, "per_image": rows, "images": len(rows)}, examples


class SuperResolutionTask(Task):
    """L1 between the network's output and the high-resolution crop; with ``train.adversarial_weight``
    > 0 also a discriminator (:class:`~upzoo.models.super_resolution.SRDiscriminator`) and the
    non-saturating GAN loss (SRGAN's recipe); with ``train.perceptual_weight`` > 0 also an L1 distance
    of frozen ImageNet EfficientNet-Lite0 features (:class:`~upzoo.models.pretrained.PerceptualLoss`,
    a stand-in for SRGAN's VGG loss, whose weights cannot be had offline). Evaluated on the held-out
    images; ``best.pt`` by Y-channel PSNR."""

    kind = "super_resolution"
    eval_columns = [f"val_{k}" for k in METRICS]
    curve_columns = ["val_psnr_y", "val_ssim_y", "val_spectral_error"]
    best_key = "val_psnr_y"

    def __init__(self, prepared: Prepared) -> None:
        super().__init__(prepared)
        self.scale = prepared.spec.options["scale"]
        self.modules = {"model": build_model(prepared.spec)}
        self.adversarial = prepared.recipe.train.adversarial_weight
        if self.adversarial > 0:
            channels = prepared.spec.options.get("in_channels", 3)
            self.modules["discriminator"] = SRDiscriminator(channels, prepared.recipe.train.discriminator_base_channels)
        self.perceptual_weight = prepared.recipe.train.perceptual_weight
        self.perceptual = PerceptualLoss() if self.perceptual_weight > 0 else None  # frozen, never saved
        self.step_columns = ["loss", "loss_l1"] + (["loss_d", "loss_adversarial"] if self.adversarial > 0 else [])
        self.step_columns += ["loss_perceptual"] if self.perceptual is not None else []
        self.last: dict[str, Any] = {}

    def step(self, batch: dict, ctx: StepContext) -> dict[str, float]:
        low, target = ctx.to_device(batch["image"], image=True), ctx.to_device(batch["target"], image=True)
        with ctx.autocast():
            output = ctx.net("model")(low)
        loss = l1 = F.l1_loss(output.float(), target)
        values: dict[str, float] = {}
        if self.adversarial > 0:
            discriminator = ctx.net("discriminator")
            with ctx.autocast():
                logits = discriminator(torch.cat([target, output.detach()])).float()
            real, fake = logits.chunk(2)
            loss_d = F.binary_cross_entropy_with_logits(real, torch.ones_like(real))
            loss_d = loss_d + F.binary_cross_entropy_with_logits(fake, torch.zeros_like(fake))
            values["loss_d"] = ctx.optimize(loss_d, "discriminator")
            with ctx.autocast():
                logits_g = discriminator(output).float()
            adversarial = F.binary_cross_entropy_with_logits(logits_g, torch.ones_like(logits_g))
            values["loss_adversarial"] = float(adversarial.detach())
            loss = l1 + self.adversarial * adversarial
        if self.perceptual is not None:
            perceptual = self.perceptual.to(output.device)(output, target)
            values["loss_perceptual"] = float(perceptual.detach())
            loss = loss + self.perceptual_weight * perceptual
        values["loss_l1"] = float(l1.detach())
        return {"loss": ctx.optimize(loss, "model"), **values}

    def evaluate(self, ctx: StepContext) -> dict[str, float]:
        from upzoo.figures import super_resolution_grid

        metrics, examples = evaluate_super_resolution(
            self.modules["model"], self.prepared.data.val, self.scale, ctx.device, ctx.autocast,
            keep=self.prepared.recipe.eval.grid_samples,
        )  # fmt: skip
        self.last = metrics
        compared = ("psnr_y", "ssim_y", "spectral_error")
        self.curve_baselines = {f"val_{k}": ("bicubic", metrics[f"bicubic_{k}"]) for k in compared}
        if ctx.is_main and examples:
            super_resolution_grid(examples, ctx.run_path / "predictions.png")
        return {f"val_{k}": metrics[k] for k in METRICS}

    def summary(self, last: dict[str, float], best: float | None) -> dict[str, Any]:
        return {"last_loss": last.get("loss", float("nan")), "val": self.last, "best_psnr_y": best}

    def input_shapes(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        item = self.prepared.data.train[0]
        shapes = {"model": ((2, *item["image"].shape),)}
        if self.adversarial > 0:
            shapes["discriminator"] = ((2, *item["target"].shape),)
        return shapes
