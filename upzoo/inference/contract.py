"""The contract an exported model carries: what its input must be and what its output means, so that
a deployment needs nothing but the file — ONNX ``metadata_props`` and, for a ``.pt2`` program, an
``upzoo_contract.json`` extra file. Every value is a string (JSON for lists), as ONNX metadata is.

Keys: ``upzoo.version``, ``upzoo.recipe_sha256``, ``upzoo.task``; for segmentation models
``input.layout`` (``NCHW`` / ``NCDHW``), ``input.dtype`` (``float32``), ``input.preprocessing`` (in
words), ``input.mean`` / ``input.std`` (or ``null``), ``input.channels``, ``spatial_dims``,
``output.layout`` (logits ``NKHW`` / ``NKDHW``, labels = argmax over K), ``class_names``,
``palette`` (RGB per class), ``training_spacing_mm`` (volumes); for generators ``input.layout``
(``NL``, latents from N(0, 1)), ``output.range`` (``[-1, 1]``).
"""

from __future__ import annotations

import json
from typing import Any

from upzoo.runs.identity import recipe_digest
from upzoo.runs.trained_model import LoadedModel

__all__ = ["export_contract", "sr_weights_contract", "CONTRACT_FILE"]

CONTRACT_FILE = "upzoo_contract.json"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("upzoo")
    except PackageNotFoundError:
        return "unknown"


def export_contract(loaded: LoadedModel) -> dict[str, str]:
    """The contract of ``loaded``'s model (see the module); string keys and values."""
    contract: dict[str, Any] = {
        "upzoo.version": _version(),
        "upzoo.recipe_sha256": recipe_digest(loaded.recipe.to_dict()),
        "upzoo.task": loaded.task,
    }
    options = loaded.spec.options
    if loaded.task in ("gan", "generator_testbed"):  # a testbed generator has no tanh: its range is what it fitted
        contract.update({
            "input.layout": "NL",
            "input.dtype": "float32",
            "input.latent_dim": options["latent_dim"],
            "input.preprocessing": "latents drawn from N(0, 1)" if loaded.task == "gan" else
                                   "the latents the run was trained with (N(0, 1), seeded by train.seed)",
            "output.layout": "NCHW",
            "output.range": [-1.0, 1.0] if loaded.task == "gan" else "unbounded (fitted to images in [-1, 1])",
        })  # fmt: skip
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in contract.items()}
    upscaler = _upscaler_contract(loaded.task, options)
    if upscaler is not None:
        contract.update(upscaler)
        if loaded.class_names:
            contract["class_names"] = loaded.class_names
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in contract.items()}
    dims = options.get("spatial_dims", 2)
    volumes = loaded.volumes
    normalise = loaded.recipe.data.normalize or ("zscore" if volumes else "imagenet")
    preprocessing = (
        f"per-volume intensity normalisation '{normalise}' of (C, D, H, W) voxels"
        if volumes
        else "pixels / 255 (uint8 RGB), then (x - mean) / std per channel; any size (padded inside)"
        if loaded.mean is not None
        else "pixels / 255 (uint8); any size (padded inside)"
    )
    contract.update({
        "input.layout": "NCDHW" if dims == 3 else "NCHW",
        "input.dtype": "float32",
        "input.channels": options.get("in_channels", 3),
        "input.preprocessing": preprocessing,
        "input.mean": list(loaded.mean) if loaded.mean is not None else None,
        "input.std": list(loaded.std) if loaded.std is not None else None,
        "spatial_dims": dims,
        "output.layout": ("NKDHW" if dims == 3 else "NKHW") + " logits; labels = argmax over K",
        "class_names": loaded.class_names,
        "palette": loaded.palette.tolist() if loaded.palette is not None else None,
        "training_spacing_mm": list(loaded.spacing) if loaded.spacing is not None else None,
    })  # fmt: skip
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in contract.items()}


def sr_weights_contract(weights: str, channels: int, scale: int) -> dict[str, str]:
    """The contract of a network with shipped weights (``upzoo upscale --export``): a super-resolution
    run's, naming the weights instead of a recipe."""
    contract = {"upzoo.version": _version(), "upzoo.task": "super_resolution", "upzoo.weights": weights,
                **_upscaler_contract("super_resolution", {"in_channels": channels, "scale": scale})}  # fmt: skip
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in contract.items()}


def _upscaler_contract(task: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """What an image or slice upscaler's export takes and gives (``None`` for other tasks)."""
    if task == "super_resolution":
        return {
            "input.layout": "NCHW",
            "input.dtype": "float32",
            "input.channels": options.get("in_channels", 3),
            "input.preprocessing": "pixels / 255 (uint8) or / 65535 (uint16), RGB; any size",
            "scale": options["scale"],
            "output.layout": "NCHW, H and W times scale",
            "output.range": "[0, 1] after clamping; pixels = round(output * 255)",
        }
    if task == "through_plane_segmentation":
        return {
            "input.layout": "NCDHW (D: the slice axis, NIfTI's third voxel axis)",
            "input.dtype": "float32",
            "input.channels": options.get("in_channels", 1),
            "input.preprocessing": "voxels / 255 (uint8) or / the volume's maximum; any size (padded inside)",
            "scale": list(options["scale"]),
            "output.layout": "NKDHW logits on the thin grid (each axis times its scale); labels = argmax over K",
        }
    if task == "through_plane_sr":
        return {
            "input.layout": "NCDHW (D: the slice axis, NIfTI's third voxel axis)",
            "input.dtype": "float32",
            "input.channels": options.get("in_channels", 1),
            "input.preprocessing": "voxels / 255 (uint8) or / the volume's maximum; any size",
            "scale": list(options["scale"]),
            "output.layout": "NCDHW, each axis times its scale",
            "output.range": "[0, 1] after clamping; times the input's divisor",
        }
    return None
