"""Checkerboards from initialisation (Odena, Dumoulin & Olah, "Deconvolution and Checkerboard
Artifacts", Distill 2016): the image checkerboard score (`upzoo.metrics.image_checkerboard`) of fresh
DCGAN generators' outputs, per generator upsampler, over many seeds — the quick recipe's generator
(32x32, latent 100, base channels 32), in eval mode, 64 images from fixed latents per seed, mapped
from [-1, 1] to [0, 1]. The theoretical column is the unevenness of the transposed kernels' overlap
(`upzoo.bench.artifacts.overlap_unevenness`; 0 for an even overlap).

    python tools/checkerboard_study.py [--seeds 8] [--images 64]
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch

from upzoo import DCGANGenerator
from upzoo.bench.artifacts import overlap_unevenness
from upzoo.metrics import image_checkerboard
from upzoo.upsamplers.transposed import CheckerboardWarning

TRANSPOSED = {"k4 s2 p1 (DCGAN)": (4, 1, 0), "k3 s2 p1 op1": (3, 1, 1), "k2 s2": (2, 0, 0)}
K4 = {"upsampler": "transposed", "upsampler_options": {"kernel_size": 4, "padding": 1}}
#: each generator as DCGANGenerator's keyword arguments (upsampler, options, last stage, post-filter)
VARIANTS: dict[str, dict] = {
    **{
        f"transposed {label}": {
            "upsampler": "transposed", "upsampler_options": {"kernel_size": k, "padding": p, "output_padding": op}
        }
        for label, (k, p, op) in TRANSPOSED.items()
    },
    "interp_conv nearest": {"upsampler": "interp_conv", "upsampler_options": {"mode": "nearest"}},
    "interp_conv bilinear": {"upsampler": "interp_conv", "upsampler_options": {"mode": "bilinear"}},
    "pixel_shuffle (ICNR)": {"upsampler": "pixel_shuffle"},
    "pixel_shuffle icnr=False": {"upsampler": "pixel_shuffle", "upsampler_options": {"icnr": False}},
    "fir": {"upsampler": "fir"},
    "dysample": {"upsampler": "dysample"},
    "carafe": {"upsampler": "carafe"},
    "transposed k4, last stage fir": {**K4, "last_upsampler": "fir"},
    "transposed k4, last stage interp_conv nearest": {**K4, "last_upsampler": "interp_conv"},
    "transposed k4 + masked_blur post-filter": {**K4, "post_filter": "masked_blur"},
}  # fmt: skip


def score(generator_options: dict, seed: int, images: int) -> float:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckerboardWarning)
        generator = DCGANGenerator(
            latent_dim=100, out_channels=3, resolution=32, base_channels=32, **generator_options
        ).eval()
    latents = torch.randn(images, 100, generator=torch.Generator().manual_seed(1000 + seed))
    with torch.no_grad():
        return image_checkerboard((generator(latents) + 1) / 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--images", type=int, default=64)
    args = parser.parse_args()
    print(f"torch {torch.__version__}; {args.seeds} seeds x {args.images} images of 32x32 per generator\n")
    print("| generator upsampler | checkerboard, fresh: mean ± std | min..max | theoretical overlap unevenness |")
    print("|---|---|---|---|")
    for label, options in VARIANTS.items():
        values = [score(options, seed, args.images) for seed in range(args.seeds)]
        theory = "—"
        if options["upsampler"] == "transposed" and len(options) == 2:  # every stage transposed, nothing after
            theory = f"{overlap_unevenness((options['upsampler_options']['kernel_size'],) * 2, (2, 2)):.3f}"
        print(
            f"| {label} | {statistics.mean(values):.3f} ± {statistics.stdev(values):.3f} | "
            f"{min(values):.3f}..{max(values):.3f} | {theory} |"
        )


if __name__ == "__main__":
    main()
