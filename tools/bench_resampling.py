"""Prediction at another voxel spacing (issue: deploy like the peers): a 3D U-Net trained on the
embedded organs at 5.0 x 0.8 x 0.8 mm predicts held-out synthetic cases generated at that spacing
and — the same anatomy, drawn in millimetres — at twice it (10.0 x 1.6 x 1.6 mm, an eighth of the
voxels) and at twice it in-plane only (5.0 x 1.6 x 1.6 mm), once resampled to the training spacing
and back (upzoo predict's default) and once run at its own grid (``--no-resample``). Dice per organ
against each grid's own ground truth, mean over the three organs and the cases.

    python tools/bench_resampling.py [--run RUN | --out RUN] [--cases 6] [--epochs 30]

Without ``--run`` it trains ``recipes/volume_unet3d_aniso.yaml`` (``--epochs``) first, into ``--out``
(default: a temporary folder).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from upzoo.data.synthetic.volumes import ORGAN_NAMES, organ_volume
from upzoo.inference import Predictor, load_model
from upzoo.recipe import load_recipe
from upzoo.train.engine import train

ROOT = Path(__file__).resolve().parents[1]
FINE, FINE_SHAPE = (5.0, 0.8, 0.8), (24, 96, 96)
COARSE = {"2x": ((10.0, 1.6, 1.6), (12, 48, 48)), "2x in-plane": ((5.0, 1.6, 1.6), (24, 48, 48))}


def organ_dice(prediction: np.ndarray, truth: np.ndarray) -> list[float]:
    scores = []
    for cls in range(1, len(ORGAN_NAMES)):
        p, t = prediction == cls, truth == cls
        if t.any() or p.any():
            scores.append(2 * np.logical_and(p, t).sum() / (p.sum() + t.sum()))
    return scores


def evaluate(run: Path, cases: int) -> dict[str, list[float]]:
    loaded = load_model(run)
    predictors = {"resampled": Predictor(loaded), "not resampled": Predictor(loaded, resample=False)}
    scores: dict[tuple[str, str], list[float]] = {}
    for i in range(cases):
        seed = [12345, i]  # not among the training seeds ([0, i])
        thickness = 2.5 * FINE[0]
        image, truth = organ_volume(np.random.default_rng(seed), FINE_SHAPE, FINE, thickness)
        prediction = predictors["resampled"].predict(image, FINE).labels
        scores.setdefault(("training", "as is"), []).extend(organ_dice(prediction, truth))
        for grid, (spacing, shape) in COARSE.items():
            image, truth = organ_volume(np.random.default_rng(seed), shape, spacing, thickness)
            for name, predictor in predictors.items():
                prediction = predictor.predict(image, spacing).labels
                scores.setdefault((grid, name), []).extend(organ_dice(prediction, truth))
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None, help="a trained volume run (default: train one)")
    parser.add_argument("--out", type=Path, default=None, help="where to keep the run trained without --run")
    parser.add_argument("--cases", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run
        if run is None:
            recipe = load_recipe(ROOT / "recipes" / "volume_unet3d_aniso.yaml", [f"train.epochs={args.epochs}"])
            start = time.perf_counter()
            run = args.out or Path(tmp) / "run"
            train(recipe, run, progress=False)
            seconds = time.perf_counter() - start
            print(f"trained recipes/volume_unet3d_aniso.yaml ({args.epochs} epochs) in {seconds:.0f} s")
        scores = evaluate(run, args.cases)
    print(f"\nDice per organ ({', '.join(ORGAN_NAMES[1:])}), mean ± std over {args.cases} held-out cases\n")
    print("| input spacing (mm) | prediction | Dice | minus Dice at the training spacing |")
    print("|---|---|---|---|")
    reference = np.mean(scores[("training", "as is")])
    shown = {"training": FINE, **{grid: spacing for grid, (spacing, _) in COARSE.items()}}
    for (grid, name), values in scores.items():
        spacing = " x ".join(f"{v:.1f}" for v in shown[grid])
        print(f"| {spacing} ({grid}) | {name} | {np.mean(values):.3f} ± {np.std(values):.3f} "
              f"| {np.mean(values) - reference:+.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
