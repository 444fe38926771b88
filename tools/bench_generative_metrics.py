"""Speed of the generative metrics on two sets of 64x64 RGB images (issue: generators that learn):

- SWD (upzoo.metrics.sliced_wasserstein) against the NumPy port of the reference code in
  tests/test_generative_metrics.py (Karras et al.'s definition: SciPy pyramid, fancy-index patches,
  NumPy sorts along the patch axis), both with 128 patches per image, 4 x 128 directions;
- KID on given 2048-d features: upzoo.metrics.feature_distance.kernel_distance against torchmetrics'
  KernelInceptionDistance.compute (100 subsets of 1,000, the same default);
- the radial spectra of both sets and the spectral error.

    python tools/bench_generative_metrics.py [--images 10000] [--rounds 3] [--metrics swd,kid,spectrum]

Rounds are interleaved; the table gives the median seconds and the ratio. Run it alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_generative_metrics import (  # noqa: E402
    ref_finalize_descriptors,
    ref_laplacian_pyramid,
    ref_sliced_wasserstein,
)

from upzoo.metrics.feature_distance import kernel_distance  # noqa: E402
from upzoo.metrics.sliced_wasserstein import SlicedWasserstein  # noqa: E402
from upzoo.metrics.spectrum import radial_power_spectrum, spectral_error  # noqa: E402


def numpy_swd(a: np.ndarray, b: np.ndarray, batch: int = 500) -> list[float]:
    """The reference's feed/end loop (uint8-range float images, 3 levels for 64x64)."""
    rng = np.random.default_rng(0)
    levels = 3
    descriptors = []
    for images in (a, b):
        per_level = [[] for _ in range(levels)]
        for start in range(0, len(images), batch):
            for lod, level in enumerate(ref_laplacian_pyramid(images[start : start + batch], levels)):
                per_level[lod].append(_ref_descriptors(level, rng))
        descriptors.append([ref_finalize_descriptors(d) for d in per_level])
    distances = []
    for real, fake in zip(*descriptors):
        repeats = []
        for _ in range(4):
            dirs = rng.standard_normal((real.shape[1], 128))
            dirs = (dirs / np.sqrt(np.sum(np.square(dirs), axis=0, keepdims=True))).astype(np.float32)
            repeats.append(ref_sliced_wasserstein(real, fake, dirs))
        distances.append(np.mean(repeats) * 1e3)
    return distances + [float(np.mean(distances))]


def _ref_descriptors(minibatch: np.ndarray, rng: np.random.Generator, size: int = 7, per_image: int = 128):
    """The reference's get_descriptors_for_minibatch."""
    s = minibatch.shape
    n, h = per_image * s[0], size // 2
    nhood, chan, x, y = np.ogrid[0:n, 0 : s[1], -h : h + 1, -h : h + 1]
    img = nhood // per_image
    x = x + rng.integers(h, s[3] - h, size=(n, 1, 1, 1))
    y = y + rng.integers(h, s[2] - h, size=(n, 1, 1, 1))
    idx = ((img * s[1] + chan) * s[2] + y) * s[3] + x
    return minibatch.flat[idx]


def upzoo_swd(a: torch.Tensor, b: torch.Tensor, batch: int = 500) -> dict[str, float]:
    metric = SlicedWasserstein()
    for images, real in ((a, True), (b, False)):
        for start in range(0, len(images), batch):
            metric.update(images[start : start + batch], real=real)
    return metric.compute()


def torchmetrics_kid(real: torch.Tensor, fake: torch.Tensor) -> float:
    from torchmetrics.image.kid import KernelInceptionDistance

    kid = KernelInceptionDistance(feature=nn.Identity(), subsets=100, subset_size=1000)
    kid.real_features, kid.fake_features = [real.float()], [fake.float()]
    start = time.perf_counter()
    kid.compute()
    return time.perf_counter() - start


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--metrics", default="swd,kid,spectrum", help="which to time (comma-separated)")
    args = parser.parse_args()
    chosen = set(args.metrics.split(","))
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.rand(args.images, 3, 64, 64, generator=gen) for _ in range(2))
    a_np, b_np = (x.numpy() * 255 for x in (a, b))
    fa, fb = (torch.randn(args.images, 2048, generator=gen, dtype=torch.float64) for _ in range(2))
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        measured = {
            "swd": lambda: (timed(upzoo_swd, a, b), timed(numpy_swd, a_np, b_np)),
            "kid": lambda: (timed(kernel_distance, fa, fb), torchmetrics_kid(fa, fb)),
            "spectrum": lambda: (
                timed(lambda: spectral_error(radial_power_spectrum(b), radial_power_spectrum(a))),
                0.0,
            ),
        }
        for name in ("swd", "kid", "spectrum"):
            if name in chosen:
                ours, reference = measured[name]()
                times.setdefault(name, []).append(ours)
                times.setdefault(f"{name}_reference", []).append(reference)
    median = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: f"{min(v):.2f}-{max(v):.2f}" for k, v in times.items()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.images} images of 64x64 per set, "
          f"median of {args.rounds} interleaved rounds (range)\n")  # fmt: skip
    print("| metric | upzoo (s) | reference (s) | reference / upzoo |")
    print("|---|---|---|---|")
    titles = {
        "swd": ("SWD (3 levels, 128 patches/image, 4x128 directions)", "NumPy port"),
        "kid": ("KID on given 2048-d features (100 subsets of 1,000)", "torchmetrics"),
        "spectrum": ("spectra of both sets + spectral error", ""),
    }
    for name, (title, reference) in titles.items():
        if name not in times:
            continue
        ours, theirs = median[name], median[f"{name}_reference"]
        cells = (
            f"{theirs:.2f} ({spread[f'{name}_reference']}) {reference} | {theirs / ours:.2f}x" if reference else " |"
        )
        print(f"| {title} | {ours:.2f} ({spread[name]}) | {cells} |")


if __name__ == "__main__":
    main()
