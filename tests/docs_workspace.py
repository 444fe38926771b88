"""The workspace the README's and docs' examples run in (see the root ``conftest.py``): tiny trained
runs where the docs name them, and the inputs the examples read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from PIL import Image


def _train(recipe: dict, run: Path, cache: Path) -> None:
    from upzoo.recipe import parse_recipe
    from upzoo.train.engine import train

    recipe["data"] = {"num_workers": 0, "cache_dir": str(cache), **recipe["data"]}
    recipe["train"] = {"max_steps": 1, **recipe.get("train", {})}
    train(parse_recipe(recipe), run, progress=False)


def build_workspace(path: Path, root: Path) -> Path:
    """Runs at ``runs/{quickstart,volume,dcgan,sr_espcn_x2}-<time>`` and ``runs/featup-jafar``, ``street.png``,
    ``photos/``, ``scans/``, ``Task01/dataset.json`` (a ``test`` list), ``model.onnx`` (the quickstart
    run's) and ``recipes``."""
    from upzoo.data.volumes import write_nifti
    from upzoo.inference.export import export_model
    from upzoo.runs.trained_model import load_model

    cache = path.parent / "cache"
    runs = path / "runs"
    unet = {"architecture": "unet", "in_channels": 3, "num_classes": 19, "channels": [4, 8], "spatial_dims": 2}
    data_2d = {"synthetic_train": 2, "synthetic_val": 1, "synthetic_size": [32, 64], "batch_size": 2}
    _train({"model": unet, "data": {**data_2d, "crop_size": [32, 32]}}, runs / "quickstart-<time>", cache)
    volume = {"architecture": "unet", "spatial_dims": 3, "in_channels": 1, "num_classes": 4,
              "channels": [4, 8], "strides": [[1, 2, 2]]}  # fmt: skip
    volume_data = {"kind": "volumes", "synthetic_train": 2, "synthetic_val": 1, "synthetic_size": [8, 24, 24],
                   "crop_size": [8, 16, 16], "batch_size": 1}  # fmt: skip
    _train({"model": volume, "data": volume_data}, runs / "volume-<time>", cache)
    dcgan = {"architecture": "dcgan", "latent_dim": 8, "out_channels": 3, "resolution": 16, "base_channels": 4}
    gan_data = {"kind": "images", "synthetic_train": 8, "synthetic_val": 8, "batch_size": 2}
    gan_train = {"discriminator_base_channels": 4}
    gan_eval = {"gan_images": 16, "features": None}
    _train({"model": dcgan, "data": gan_data, "train": gan_train, "eval": gan_eval}, runs / "dcgan-<time>", cache)

    espcn = {"architecture": "espcn", "scale": 2, "channels": [4, 4]}
    sr_data = {"kind": "package_images", "package_train": ["chelsea"], "package_val": ["coffee"],
               "crop_size": [32, 32], "patches_per_image": 2, "batch_size": 2}  # fmt: skip
    _train({"model": espcn, "data": sr_data}, runs / "sr_espcn_x2-<time>", cache)
    featup = {"architecture": "feature_upsampler", "backbone": "vit_tiny_patch16_224", "weights": "random",
              "upsampler": "jafar", "upsampler_options": {"qk_dim": 16}}  # fmt: skip
    featup_data = {**data_2d, "crop_size": [32, 64], "normalize": "minmax"}
    _train({"model": featup, "data": featup_data, "train": {"feature_ratios": [2]}}, runs / "featup-jafar", cache)

    rng = np.random.default_rng(0)
    for name in ("street.png", "photos/a.png", "photos/b.png"):
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (40, 72, 3), dtype=np.uint8)).save(path / name)
    spacing = load_model(runs / "volume-<time>").spacing
    for name in ("scans/case1.nii.gz", "Task01/imagesTs/t1.nii.gz"):
        write_nifti(path / name, rng.normal(size=(8, 20, 20)).astype(np.float32), spacing)
    (path / "Task01" / "dataset.json").write_text(json.dumps({"test": ["./imagesTs/t1.nii.gz"]}))
    export_model(load_model(runs / "quickstart-<time>"), "onnx", path / "model.onnx")
    os.symlink(root / "recipes", path / "recipes")
    (runs / "cmp").mkdir()  # what `bench compare --plan-only --out runs/cmp` makes, for `bench collect runs/cmp`
    return path
