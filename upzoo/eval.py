"""Evaluating a trained checkpoint (``upzoo eval``): a segmentation model on a recipe's validation
data, or a generator's images against held-out real images."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from upzoo.errors import ConfigError
from upzoo.recipe import Recipe
from upzoo.runs.trained_model import load_model
from upzoo.runtime import autocast, resolve_device
from upzoo.train.evaluate import evaluate_segmentation
from upzoo.windows import window_patch

__all__ = ["evaluate_checkpoint", "evaluate_generator", "evaluate_upscaler", "evaluate_through_plane_checkpoint"]


def evaluate_checkpoint(recipe: Recipe, checkpoint: str | Path) -> dict[str, Any]:
    """Metrics of ``checkpoint`` (written by ``upzoo train``) on ``recipe``'s validation split.

    The model is rebuilt from the checkpoint's own resolved model spec, so ``strides: auto`` and
    ``--set`` overrides used at training time come back exactly.

    GAN recipes go to :func:`evaluate_generator`.

    Raises:
        ConfigError: a checkpoint that does not fit the recipe's data. DataError: a missing or corrupt
            checkpoint.
    """
    from dataclasses import replace

    from upzoo.prepare import prepare

    if recipe.task == "gan":
        return evaluate_generator(recipe, checkpoint)
    if recipe.task == "super_resolution":
        return evaluate_upscaler(recipe, checkpoint)
    if recipe.task == "feature_upsampling":
        return evaluate_feature_upsampler(recipe, checkpoint)
    if recipe.task == "generator_testbed":
        return evaluate_testbed(recipe, checkpoint)
    if recipe.task in ("through_plane_sr", "through_plane_segmentation"):
        return evaluate_through_plane_checkpoint(recipe, checkpoint)
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


def evaluate_generator(recipe: Recipe, checkpoint: str | Path) -> dict[str, Any]:
    """The generative metrics (:mod:`upzoo.metrics.generative`) of ``eval.gan_images`` images of the
    checkpoint's generator against as many held-out real images of ``recipe``'s data (its validation
    split, else its training images); KID/FD with ``eval.features``. The images are generated under
    the recipe's ``train.amp``, as the evaluations during training were.

    Raises:
        DataError: a missing or corrupt checkpoint, or data that does not load.
    """
    from upzoo.data.factory import build_datasets
    from upzoo.train.gan_evaluation import GanEvaluator, held_out_images, say_gan_images

    device = resolve_device(recipe.train.device, "train.device")
    loaded = load_model(checkpoint, device=device, kind="gan", purpose="upzoo eval")
    options = loaded.spec.options
    bundle = build_datasets(recipe.data, task="gan", resolution=options["resolution"])
    real, held_out = held_out_images(bundle)
    say_gan_images(recipe.eval.gan_images, real, held_out)
    evaluator = GanEvaluator(
        real, recipe.eval.gan_images, options["latent_dim"], recipe.train.seed, recipe.eval.features
    )
    precision = functools.partial(autocast, recipe.train.amp, device)  # as training evaluated it
    report = evaluator.real.compare(evaluator.generate(loaded.model, device, precision))
    return {**report.as_dict(), "images": evaluator.count, "real_images": held_out, "checkpoint": str(checkpoint),
            "step": loaded.step}  # fmt: skip


def evaluate_upscaler(recipe: Recipe, checkpoint: str | Path) -> dict[str, Any]:
    """A super-resolution checkpoint on ``recipe``'s held-out images (e.g. ``--set
    data.kind=package_images``): PSNR/SSIM on Y with the scale's border cropped, RGB PSNR, spectral
    error and checkerboard, per image and their means, beside bicubic interpolation's.

    Raises:
        ConfigError: data that does not fit the model. DataError: a missing or corrupt checkpoint.
    """
    from dataclasses import replace

    from upzoo.prepare import prepare
    from upzoo.train.super_resolution import evaluate_super_resolution

    device = resolve_device(recipe.train.device, "train.device")
    loaded = load_model(checkpoint, device=device, kind="super_resolution", purpose="upzoo eval")
    trained, asked = loaded.spec.options["scale"], recipe.model.options.get("scale")
    if asked != trained:
        raise ConfigError(
            f"checkpoint {checkpoint} upscales x{trained}, the recipe asks for x{asked}: a super-resolution model "
            f"works at the scale it was trained for; evaluate a x{asked} run or drop the scale override"
        )
    prepared = prepare(replace(recipe, model=loaded.spec))
    precision = functools.partial(autocast, recipe.train.amp, device)
    metrics, _ = evaluate_super_resolution(loaded.model, prepared.data.val, loaded.spec.options["scale"], device,
                                           precision, keep=0)  # fmt: skip
    return {**metrics, "scale": loaded.spec.options["scale"], "checkpoint": str(checkpoint), "step": loaded.step}


def evaluate_through_plane_checkpoint(recipe: Recipe, checkpoint: str | Path) -> dict[str, Any]:
    """A through-plane checkpoint on the held-out block of ``recipe``'s brain (e.g. ``--set
    data.slice_noise=0.02``): super-resolution's PSNR and SSIM in the brain beside linear, cubic and
    B-spline interpolation, or segmentation's Dice, HD95 and surface Dice per tissue beside the best
    thick-grid labels.

    Raises:
        ConfigError: slices of another thickness than the model's scale. DataError: a missing or corrupt checkpoint.
    """
    from dataclasses import replace

    from upzoo.prepare import prepare
    from upzoo.train.through_plane import evaluate_through_plane
    from upzoo.train.through_plane_segmentation import evaluate_tissue_block

    device = resolve_device(recipe.train.device, "train.device")
    loaded = load_model(checkpoint, device=device, kind=recipe.task, purpose="upzoo eval")
    prepared = prepare(replace(recipe, model=loaded.spec))
    precision = functools.partial(autocast, recipe.train.amp, device)
    evaluate = evaluate_tissue_block if recipe.task == "through_plane_segmentation" else evaluate_through_plane
    metrics, _ = evaluate(loaded.model, prepared.data.val, device, precision)
    return {**metrics, "checkpoint": str(checkpoint), "step": loaded.step}


def evaluate_testbed(recipe: Recipe, checkpoint: str | Path) -> dict[str, Any]:
    """A generator-testbed checkpoint regressing ``recipe``'s images from their latents: PSNR and
    the spectral errors (band and corners) as the task measures them.

    Raises:
        ConfigError: data that does not fit the model. DataError: a missing or corrupt checkpoint.
    """
    from dataclasses import replace

    from upzoo.prepare import prepare
    from upzoo.train.generator_testbed import measure_generator

    device = resolve_device(recipe.train.device, "train.device")
    loaded = load_model(checkpoint, device=device, kind="generator_testbed", purpose="upzoo eval")
    images = prepare(replace(recipe, model=loaded.spec)).data.train
    precision = functools.partial(autocast, recipe.train.amp, device)
    measured = measure_generator(loaded.model, images, device, precision)
    values = {k.removeprefix("val_"): v for k, v in measured.items() if k.startswith("val_")}
    return {**values, "images": len(images), "checkpoint": str(checkpoint), "step": loaded.step}


def evaluate_feature_upsampler(recipe: Recipe, checkpoint: str | Path) -> dict[str, Any]:
    """A feature-upsampling checkpoint on ``recipe``'s validation images: per ratio of
    ``train.feature_ratios``, the cosine similarity of its upsampled features (and of bilinear's) to
    the full images' features, and its loss.

    Raises:
        ConfigError: data that does not fit the model. DataError: a missing or corrupt checkpoint.
    """
    from dataclasses import replace

    from upzoo.prepare import prepare
    from upzoo.train.feature_upsampling import DEFAULT_RATIOS, evaluate_feature_upsampling

    device = resolve_device(recipe.train.device, "train.device")
    loaded = load_model(checkpoint, device=device, kind="feature_upsampling", purpose="upzoo eval")
    prepared = prepare(replace(recipe, model=loaded.spec))
    ratios = tuple(recipe.train.feature_ratios or DEFAULT_RATIOS)
    precision = functools.partial(autocast, recipe.train.amp, device)  # as training evaluated it
    guide = recipe.train.feature_guide
    metrics = evaluate_feature_upsampling(loaded.model, prepared.data.val, ratios, device, precision, guide)
    return {**metrics, "checkpoint": str(checkpoint), "step": loaded.step}
