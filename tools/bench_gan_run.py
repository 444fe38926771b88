"""How far a trained generator got (issue: generators that learn): the generative metrics of a GAN
run's generator and of the same generator untrained (the recipe's initialisation, same seed),
each on 1,000 images from fixed latents against 1,000 held-out real images; KID and the Fréchet
distance on the features of a segmentation run's encoder (the quickstart's knows street scenes).
Also writes the run's samples as one grid PNG for the docs.

    python tools/bench_gan_run.py RUN --features QUICKSTART_RUN [--grid docs/img/dcgan_samples.png]
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from pathlib import Path

import torch

from upzoo.data.factory import build_datasets
from upzoo.figures import sample_grid
from upzoo.models import build_model
from upzoo.runs.trained_model import load_model
from upzoo.runtime import seed_everything
from upzoo.train.gan_evaluation import GanEvaluator

KEYS = ("swd", "spectral_error", "spectral_decay", "kid", "fd", "checkerboard")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--features", type=Path, required=True, help="a segmentation run (its encoder)")
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--grid", type=Path, default=None, help="write 64 samples of the run here")
    args = parser.parse_args()
    loaded = load_model(args.run, kind="gan")
    recipe, options = loaded.recipe, loaded.spec.options
    bundle = build_datasets(recipe.data, task="gan", resolution=options["resolution"])
    real = bundle.val if bundle.val is not None else bundle.train
    evaluator = GanEvaluator(real, args.images, options["latent_dim"], recipe.train.seed, str(args.features))
    seed_everything(recipe.train.seed)
    untrained = build_model(loaded.spec).eval()
    device = torch.device("cpu")
    generators = (("untrained", untrained), (f"trained ({loaded.step} steps)", loaded.model))
    rows = {name: evaluator.real.compare(evaluator.generate(model, device, nullcontext)).as_dict()
            for name, model in generators}  # fmt: skip
    print(f"{evaluator.count} generated vs {evaluator.count} held-out real images; KID/FD features: "
          f"{rows['untrained']['features']}\n")  # fmt: skip
    print("| generator | " + " | ".join(KEYS) + " |")
    print("|---|" + "---|" * len(KEYS))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[k]:.4g}" for k in KEYS) + " |")
    if args.grid is not None:
        z = torch.randn(64, options["latent_dim"], generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            sample_grid(loaded.model(z), args.grid)
        print(f"\nwrote {args.grid}")


if __name__ == "__main__":
    main()
