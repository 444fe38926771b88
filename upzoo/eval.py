"""Evaluating a trained segmentation checkpoint on a recipe's validation data (``upzoo eval``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from upzoo.errors import ConfigError
from upzoo.recipe import Recipe
from upzoo.runs.trained_model import load_model
from upzoo.runtime import resolve_device
from upzoo.train.evaluate import evaluate_segmentation
from upzoo.windows import window_patch

__all__ = ["evaluate_checkpoint"]


def evaluate_checkpoint(recipe: Recipe, checkpoint: str | Path) -> dict[str, Any]:
    """Metrics of ``checkpoint`` (written by ``upzoo train``) on ``recipe``'s validation split.

    The model is rebuilt from the checkpoint's own resolved model spec, so ``strides: auto`` and
    ``--set`` overrides used at training time come back exactly.

    Raises:
        ConfigError: a GAN recipe. DataError: a missing or corrupt checkpoint.
    """
    from dataclasses import replace

    from upzoo.prepare import prepare

    if recipe.task != "segmentation":
        raise ConfigError(
            "upzoo eval evaluates segmentation recipes; GAN runs log sample grids and checkerboard scores"
        )
    device = resolve_device(recipe.train.device, "train.device")
    loaded = load_model(checkpoint, device=device, kind="segmentation", purpose="upzoo eval")  # the one way in
    spec, model = loaded.spec, loaded.model
    try:
        prepared = prepare(replace(recipe, model=spec))  # the data, checked against the checkpoint's model
    except ConfigError as exc:
        raise ConfigError(
            f"checkpoint {checkpoint} does not fit this recipe's data ({str(exc).split('; set ')[0]}): it was "
            f"trained with another recipe; evaluate a checkpoint of this recipe, or pass the checkpoint's run folder"
        ) from None
    bundle, num_classes = prepared.data, prepared.num_classes
    metrics, _ = evaluate_segmentation(
        model,
        bundle.val,
        num_classes=num_classes,
        ignore_index=bundle.ignore_index,
        device=device,
        amp=recipe.train.amp,
        volumes=recipe.data.kind == "volumes",
        patch_size=window_patch(recipe, volumes=recipe.data.kind == "volumes"),
        overlap=recipe.eval.overlap,
        window_batch=recipe.eval.batch_size,
    )
    names = bundle.class_names or [str(i) for i in range(num_classes)]
    return {
        **metrics,
        "class_names": names,
        "samples": len(bundle.val),
        "checkpoint": str(checkpoint),
        "step": loaded.step,
    }
