"""Data benchmark (issue: data).

1. Generation time of the embedded synthetic sets (defaults), into a fresh cache folder.
2. Loader throughput (samples/s, 2 workers, the recipe's own pipeline) vs the training-step
   throughput of the same recipe (samples/s, data already in memory), for the 2D quickstart and the
   3D recipe: a ratio above 1 means the loader is not the bottleneck.

    python tools/bench_data.py [--batches 20]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import torch
from torch.utils.data import DataLoader

from upzoo.data.factory import build_datasets
from upzoo.data.synthetic import ensure_synthetic_cityscapes, ensure_synthetic_volumes
from upzoo.models import build_model
from upzoo.recipe import load_recipe
from upzoo.train.optim import build_optimizer
from upzoo.train.tasks import segmentation_loss

ROOT = Path(__file__).resolve().parents[1]


def loader_rate(dataset, batch_size: int, batches: int, workers: int) -> float:
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True, persistent_workers=False
    )
    it = iter(loader)
    next(it)  # workers started, first batch out of the way
    start, n = time.perf_counter(), 0
    for _ in range(batches):
        try:
            n += len(next(it)["image"])
        except StopIteration:
            it = iter(loader)
    return n / (time.perf_counter() - start)


def train_rate(recipe, bundle, steps: int) -> float:
    model = build_model(recipe.model)
    opt = build_optimizer(model.parameters(), recipe.train)
    batch = next(iter(DataLoader(bundle.train, batch_size=recipe.data.batch_size, num_workers=0)))
    classes = bundle.num_classes or recipe.model.options["num_classes"]

    def step():
        loss = segmentation_loss(
            model(batch["image"]), batch["mask"], kind=recipe.train.loss, ignore_index=255, num_classes=classes
        )
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * recipe.data.batch_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("## Synthetic generation (defaults)\n\n| set | samples | seconds | per sample |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        ensure_synthetic_cityscapes(cache)
        seconds = time.perf_counter() - start
        print(f"| Cityscapes-style 256x512 | 64 + 16 | {seconds:.1f} | {seconds / 80 * 1e3:.0f} ms |")
        start = time.perf_counter()
        ensure_synthetic_volumes(cache)
        seconds = time.perf_counter() - start
        print(f"| NIfTI volumes 24x96x96 | 12 + 4 | {seconds:.1f} | {seconds / 16 * 1e3:.0f} ms |")
        print("\n## Loader vs training step\n\n| recipe | loader samples/s (2 workers) | train samples/s | ratio |")
        print("|---|---|---|---|")
        for name in ("quickstart.yaml", "volume_unet3d_aniso.yaml"):
            recipe = load_recipe(ROOT / "recipes" / name, [f"data.cache_dir={cache}"])
            bundle = build_datasets(recipe.data, task="segmentation", num_classes=recipe.model.options["num_classes"])
            loader = loader_rate(bundle.train, recipe.data.batch_size, args.batches, workers=2)
            train = train_rate(recipe, bundle, args.steps)
            print(f"| {name} | {loader:.1f} | {train:.1f} | {loader / train:.1f} |")


if __name__ == "__main__":
    main()
