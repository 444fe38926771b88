"""The feature-upsampling task: a variant of JAFAR's objective, which needs no labels (the guide
lists how it differs from the authors' training). The frozen backbone's features of an image
downscaled by ``r`` are upsampled x``r`` (guided by the image at the target grid) and matched to the
features of the full image; ``r`` cycles through ``train.feature_ratios``. Evaluated by the cosine
similarity to those targets beside bilinear upsampling's."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.errors import ConfigError
from upzoo.models import build_model
from upzoo.train.context import StepContext
from upzoo.train.tasks import Task

if TYPE_CHECKING:
    from upzoo.prepare import Prepared

__all__ = ["FeatureUpsamplingTask", "feature_loss", "evaluate_feature_upsampling"]

DEFAULT_RATIOS = (2, 4)


def feature_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """JAFAR's loss: ``1 - cos`` between predicted and target feature vectors, averaged over pixels,
    plus the mean squared error of both after scaling by the target's per-pixel min-max range."""
    prediction, target = prediction.float(), target.float()
    low = target.amin(dim=1, keepdim=True)
    span = target.amax(dim=1, keepdim=True) - low + 1e-6
    cosine = F.cosine_similarity(prediction, target, dim=1)
    return (1 - cosine).mean() + F.mse_loss((prediction - low) / span, (target - low) / span)


@torch.no_grad()
def evaluate_feature_upsampling(
    model: nn.Module,
    dataset: Any,
    ratios: tuple[int, ...],
    device: torch.device,
    precision: Callable = nullcontext,
    guide: str = "pooled",
) -> dict[str, Any]:
    """Per ratio, the mean cosine similarity (over all pixels of all images) of the block's and of
    bilinear upsampling's prediction to the target features, and the block's loss; the model runs
    under ``precision()`` (the recipe's autocast, as in training) with the objective's ``guide``
    (:meth:`~upzoo.models.feature_models.FeatureUpsampler.objective`), the measures in float32."""
    was_training = model.training
    model.eval()
    sums = {r: [0.0, 0.0, 0.0, 0] for r in ratios}  # cosine, bilinear cosine, loss, pixels
    try:
        for index in range(len(dataset)):
            images = _whole_multiple(_image_of(dataset[index])[None], model.backbone.stride * max(ratios)).to(device)
            for r in ratios:
                with precision():
                    prediction, target, low = (t.float() for t in model.objective(images, r, guide=guide))
                bilinear = F.interpolate(low, size=target.shape[-2:], mode="bilinear", align_corners=False)
                pixels = target.shape[0] * target.shape[-2] * target.shape[-1]
                sums[r][0] += float(F.cosine_similarity(prediction, target, dim=1).sum())
                sums[r][1] += float(F.cosine_similarity(bilinear, target, dim=1).sum())
                sums[r][2] += float(feature_loss(prediction, target)) * pixels
                sums[r][3] += pixels
    finally:
        model.train(was_training)
    per_ratio = {r: {"cosine": c / n, "cosine_bilinear": b / n, "loss": l / n} for r, (c, b, l, n) in sums.items()}
    result: dict[str, Any] = {
        key: math.fsum(v[key] for v in per_ratio.values()) / len(ratios)
        for key in ("cosine", "cosine_bilinear", "loss")
    }
    return result | {"per_ratio": {str(r): v for r, v in per_ratio.items()}, "images": len(dataset), "guide": guide}


def _image_of(item: dict[str, Any]) -> torch.Tensor:
    """The full-resolution image of a dataset item (segmentation: ``image``; photographs: ``target``)."""
    return item["target"] if "target" in item else item["image"]


def _whole_multiple(images: torch.Tensor, multiple: int) -> torch.Tensor:
    """The centre crop whose sides are multiples of ``multiple``."""
    h, w = (s - s % multiple for s in images.shape[-2:])
    if h == 0 or w == 0:
        raise ConfigError(
            f"a validation image of size {list(images.shape[-2:])} is smaller than stride x largest ratio ({multiple})"
        )
    top, left = (images.shape[-2] - h) // 2, (images.shape[-1] - w) // 2
    return images[..., top : top + h, left : left + w]


class FeatureUpsamplingTask(Task):
    """Trains a ``feature_upsampler`` model's block with :func:`feature_loss` on
    :meth:`~upzoo.models.feature_models.FeatureUpsampler.objective`; the backbone stays frozen.
    ``best.pt`` by the validation cosine."""

    kind = "feature_upsampling"
    step_columns = ["loss"]
    eval_columns = ["val_cosine", "val_cosine_bilinear", "val_loss"]
    curve_columns = ["val_cosine", "val_loss"]  # bilinear's cosine: the reference line in val_cosine's panel
    best_key = "val_cosine"

    def __init__(self, prepared: Prepared) -> None:
        super().__init__(prepared)
        model = build_model(prepared.spec)
        if not hasattr(model.upsampler, "resample"):
            raise ConfigError(
                f"the feature-upsampling objective trains a block at ratios below its use (x2, x4 for "
                f"x{model.backbone.stride}): "
                f"{model.upsampler_name!r} has one fixed scale; use jbu, jafar, loftup or anyup, or train "
                f"{model.upsampler_name!r} with the probe (linear_probe, train_upsampler: true)"
            )
        self.modules = {"model": model}
        self.ratios = tuple(prepared.recipe.train.feature_ratios or DEFAULT_RATIOS)
        self.consistency = prepared.recipe.train.consistency_weight
        self.guide = prepared.recipe.train.feature_guide
        self.step_columns = ["loss", "loss_consistency"] if self.consistency > 0 else ["loss"]
        if self.consistency > 0 and model.backbone.stride % 2:
            raise ConfigError(
                f"train.consistency_weight: the consistency term lifts features x stride / 2, and the backbone's "
                f"stride {model.backbone.stride} is odd; set it to 0"
            )
        self._check_crop(model.backbone.stride * max(self.ratios))
        self.last: dict[str, Any] = {}

    def _check_crop(self, multiple: int) -> None:
        data = self.prepared.recipe.data
        crop = data.crop_size or self.prepared.data.train[0][_key(self.prepared)].shape[-2:]
        if any(int(c) % multiple for c in crop):
            fitted = [max(multiple, int(c) - int(c) % multiple) for c in crop]
            raise ConfigError(
                f"data.crop_size {list(crop)}: the objective pools images by the backbone's stride x the largest ratio "
                f"({multiple}); use sides that are multiples of it, e.g. {fitted}"
            )

    def step(self, batch: dict, ctx: StepContext) -> dict[str, float]:
        images = ctx.to_device(batch[_key(self.prepared)], image=True)
        ratio = self.ratios[ctx.step % len(self.ratios)]
        with ctx.autocast():
            prediction, target, _, *pair = ctx.net("model")(
                images, ratio=ratio, consistency=self.consistency > 0, guide=self.guide
            )
        loss = feature_loss(prediction, target)
        if not pair:
            return {"loss": ctx.optimize(loss, "model")}
        consistency = feature_loss(*pair)  # the consistency term (its target computed without gradient)
        total = loss + self.consistency * consistency
        return {"loss": ctx.optimize(total, "model"), "loss_consistency": float(consistency.detach())}

    def evaluate(self, ctx: StepContext) -> dict[str, float]:
        from upzoo.figures import feature_grid

        model, data = self.modules["model"], self.prepared.data
        self.last = evaluate_feature_upsampling(model, data.val, self.ratios, ctx.device, ctx.autocast, self.guide)
        self.curve_baselines = {"val_cosine": ("bilinear", self.last["cosine_bilinear"])}
        if ctx.is_main:
            keep = [_image_of(data.val[i]) for i in range(min(len(data.val), self.prepared.recipe.eval.grid_samples))]
            feature_grid(model, keep, ctx.run_path / "predictions.png", device=ctx.device)
        return {f"val_{k}": self.last[k] for k in ("cosine", "cosine_bilinear", "loss")}

    def summary(self, last: dict[str, float], best: float | None) -> dict[str, Any]:
        return {"last_loss": last.get("loss", float("nan")), "val": self.last, "best_cosine": best}

    def input_shapes(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        return {"model": ((2, *self.prepared.data.train[0][_key(self.prepared)].shape),)}


def _key(prepared: Prepared) -> str:
    return "image" if prepared.recipe.data.kind == "cityscapes" else "target"
