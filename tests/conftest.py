"""Shared test setup: offline, deterministic, quiet."""

from __future__ import annotations

import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if "OMP_NUM_THREADS" not in os.environ:  # CI also runs the suite with OMP_NUM_THREADS=1: keep it
    # one thread per pytest-xdist worker (two workers share the two cores); two in a single process
    threads = 1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1)
    torch.set_num_threads(max(1, threads))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def small_recipe(
    cache_dir: str, *, model: dict | None = None, data: dict | None = None, train: dict | None = None
) -> dict:
    """A 2D segmentation recipe that trains a step in well under a second on embedded 32x64 scenes
    (19 classes, channels 4-8); ``model``/``data``/``train`` entries override its keys."""
    return {
        "model": {
            "architecture": "unet",
            "spatial_dims": 2,
            "in_channels": 3,
            "num_classes": 19,
            "channels": [4, 8],
            **(model or {}),
        },
        "data": {
            "synthetic_train": 4,
            "synthetic_val": 1,
            "synthetic_size": [32, 64],
            "crop_size": [32, 32],
            "batch_size": 2,
            "num_workers": 0,
            "cache_dir": str(cache_dir),
            **(data or {}),
        },
        "train": {"max_steps": 1, **(train or {})},
    }


def small_volume_recipe(cache_dir: str, **data) -> dict:
    """A 3D U-Net recipe (4 classes, channels 4-8, strides (1, 2, 2)) that trains a step on two
    embedded 8x24x24 volumes; ``data`` entries override its data keys."""
    return {
        "model": {
            "architecture": "unet",
            "spatial_dims": 3,
            "in_channels": 1,
            "num_classes": 4,
            "channels": [4, 8],
            "strides": [[1, 2, 2]],
        },  # fmt: skip
        "data": {
            "kind": "volumes",
            "synthetic_train": 2,
            "synthetic_val": 1,
            "synthetic_size": [8, 24, 24],
            "crop_size": [8, 16, 16],
            "batch_size": 1,
            "num_workers": 0,
            "cache_dir": str(cache_dir),
            **data,
        },  # fmt: skip
        "train": {"max_steps": 1},
    }


@pytest.fixture(scope="session")
def seg_run(tmp_path_factory):
    """One small trained 2D segmentation run shared by the modules that only read it (trained once per
    test run): ``RUN`` with its embedded data in ``RUN/../cache`` (3 validation scenes, 3 steps)."""
    from upzoo.recipe import parse_recipe
    from upzoo.train.engine import train

    root = tmp_path_factory.mktemp("shared-seg")
    recipe = small_recipe(root / "cache", data={"synthetic_val": 3, "crop_size": [32, 64]}, train={"max_steps": 3})
    train(parse_recipe(recipe), root / "run", progress=False)
    return root / "run"


def cli_streams(*args: str) -> tuple[int, str, str]:
    """:func:`run_cli` as ``(exit code, stdout, stderr)``."""
    result = run_cli(*args)
    return result.returncode, result.stdout, result.stderr


def run_cli(*args: str):
    """``upzoo ARGS`` through the console script's ``main`` in this process (no interpreter start-up),
    as a ``CompletedProcess`` with the exit code, stdout and stderr."""
    import subprocess

    import click
    from click.testing import CliRunner

    from upzoo.cli import main

    result = CliRunner().invoke(
        click.Command("w", callback=lambda: main([str(a) for a in args])), [], catch_exceptions=False
    )
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)
