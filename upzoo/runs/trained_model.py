"""``load_model(run_dir_or_checkpoint)``: a trained model in eval mode with what using it needs —
its recipe, classes, palette, image normalisation and voxel spacing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from upzoo.errors import DataError
from upzoo.models import ModelSpec, build_model
from upzoo.recipe import Recipe, parse_recipe
from upzoo.runs.checkpoint import CHECKPOINT_KEYS, load_checkpoint, load_weights
from upzoo.runtime import resolve_device

__all__ = ["LoadedModel", "load_model", "find_checkpoint"]


@dataclass
class LoadedModel:
    """A trained model and its data conventions. ``model`` is in eval mode."""

    model: nn.Module
    recipe: Recipe
    spec: ModelSpec
    checkpoint: Path
    class_names: list[str] | None
    palette: np.ndarray | None  # (K, 3) uint8
    mean: tuple[float, ...] | None  # 2D image normalisation (pixel / 255 - mean) / std
    std: tuple[float, ...] | None
    spacing: tuple[float, ...] | None  # training voxel spacing (volumes)
    ignore_index: int = 255
    step: int | None = None  # the training step the checkpoint was written at
    thick_peak: float | None = None  # thick-slice runs: the thick training volume's maximum (thin maximum = 1)

    @property
    def task(self) -> str:
        return self.recipe.task

    @property
    def volumes(self) -> bool:
        return self.recipe.data.kind == "volumes"

    @property
    def num_classes(self) -> int | None:
        options = self.spec.options
        return options.get("num_classes", options.get("classes"))


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given, or a run folder's ``best.pt`` (else ``last.pt``).

    Raises:
        DataError: nothing there, or a folder holding neither checkpoint.
    """
    path = Path(path)
    if path.is_file():
        return path
    if not path.exists():
        raise DataError(f"{path} does not exist; pass a run folder (written by upzoo train) or a checkpoint file")
    for name in ("best.pt", "last.pt"):
        if (path / name).is_file():
            return path / name
    raise DataError(f"{path} holds no best.pt or last.pt; pass a run folder written by upzoo train or a .pt file")


def _meta_from_recipe(recipe: Recipe) -> dict[str, Any]:
    """Checkpoints written before they carried ``data_meta``: what the recipe alone tells."""
    meta: dict[str, Any] = {"class_names": None, "palette": None, "mean": None, "std": None, "spacing": None}
    if recipe.data.kind == "cityscapes" and recipe.task == "segmentation":
        from upzoo.data.cityscapes import CLASS_NAMES
        from upzoo.data.conventions import image_conventions

        palette, mean, std = image_conventions(recipe.data)
        meta.update(class_names=list(CLASS_NAMES), palette=palette.tolist())
        meta.update(mean=list(mean) if mean else None, std=list(std) if std else None)
    return meta


def load_model(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    kind: str | None = None,
    purpose: str = "using a trained model",
) -> LoadedModel:
    """The model of a run folder (its ``best.pt``, else ``last.pt``) or of a checkpoint file,
    rebuilt from the checkpoint's own model spec, weights loaded (``weights_only``), in eval mode.

    >>> loaded = load_model("runs/quickstart")  # doctest: +SKIP
    >>> loaded.class_names[:2], loaded.model.training  # doctest: +SKIP
    (['road', 'sidewalk'], False)

    Raises:
        DataError: a missing, corrupt or foreign checkpoint, or weights that do not fit the spec.
    """
    if not isinstance(path, (str, Path)) or not str(path):
        raise DataError(f"load_model takes a run folder or checkpoint path, got {path!r} ({type(path).__name__})")
    device = resolve_device(device, "device")
    checkpoint = find_checkpoint(path)
    state = load_checkpoint(checkpoint, kind=kind, purpose=purpose)
    kind = state.get("kind")
    if kind not in CHECKPOINT_KEYS or "model_spec" not in state or "recipe" not in state:
        raise DataError(
            f"{checkpoint} is not a complete checkpoint of an upzoo segmentation, GAN, super-resolution or "
            f"feature-upsampling run"
        )
    recipe = parse_recipe({**state["recipe"], "model": state["model_spec"]}, source=str(checkpoint))
    spec = ModelSpec.from_dict(state["model_spec"])
    model = build_model(spec)
    weights = state["generator"] if kind == "gan" else state["model"]
    load_weights(model, weights, checkpoint, saved_spec=state["model_spec"])
    meta = state.get("data_meta") or _meta_from_recipe(recipe)
    palette = np.asarray(meta["palette"], dtype=np.uint8) if meta.get("palette") else None
    if palette is not None and meta.get("class_names"):
        palette = palette[: len(meta["class_names"])]  # runs written before PALETTE lost its ignore colour
    return LoadedModel(
        model=model.to(device).eval(),
        recipe=recipe,
        spec=spec,
        checkpoint=checkpoint,
        class_names=meta.get("class_names"),
        palette=palette,
        mean=tuple(meta["mean"]) if meta.get("mean") else None,
        std=tuple(meta["std"]) if meta.get("std") else None,
        spacing=tuple(meta["spacing"]) if meta.get("spacing") else None,
        ignore_index=int(meta.get("ignore_index", 255)),
        step=state.get("step"),
        thick_peak=meta.get("thick_peak"),
    )
