"""Boundary and surface metrics (issue: evidence), each a ratio against a reference measured in the
same run, interleaved, median and interquartile range:

1. Boundary IoU (and the boundary F-score) of 8 label maps 1024x2048 with 19 classes vs the mIoU
   accumulation (ConfusionMatrix) on the same batch; region-like maps (a 32x64 random map upsampled,
   10 % ignored), not noise, where every pixel would be a boundary;
2. HD95 + surface Dice of a 128^3 volume with 4 classes (ellipsoids, the prediction perturbed) vs
   MONAI's compute_hausdorff_distance(percentile=95) + compute_surface_dice on the same input, values
   checked equal.

    python tools/bench_evidence.py [--runs 5]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch

from upzoo.bench.speed import compare_calls
from upzoo.metrics import BoundaryFScore, BoundaryIoU, ConfusionMatrix, hausdorff95, surface_dice, surface_metrics


def _line(name: str, timing, reference) -> str:
    return (
        f"  {name:<34} {timing.median * 1e3:9.1f} ms (IQR {timing.q1 * 1e3:.1f}-{timing.q3 * 1e3:.1f})"
        f"  {timing.median / reference.median:6.2f}x the reference"
    )


def bench_boundary(runs: int) -> None:
    g = torch.Generator().manual_seed(0)
    coarse = torch.randint(0, 19, (8, 1, 32, 64), generator=g).float()
    target = torch.nn.functional.interpolate(coarse, size=(1024, 2048), mode="nearest")[:, 0].long()
    pred = target.clone()
    flip = torch.nn.functional.interpolate(
        (torch.rand(8, 1, 128, 256, generator=g) < 0.1).float(), size=(1024, 2048), mode="nearest"
    )[:, 0].bool()
    pred[flip] = torch.randint(0, 19, (int(flip.sum()),), generator=g)
    target[torch.rand(target.shape, generator=g) < 0.1] = 255

    def miou() -> None:
        ConfusionMatrix(19).update(pred, target)

    def biou() -> None:
        BoundaryIoU(19).update(pred, target)

    def fscore() -> None:
        BoundaryFScore(19).update(pred, target)

    times = compare_calls({"mIoU": miou, "Boundary IoU": biou, "boundary F": fscore}, warmup=1, runs=runs)
    print(f"8x1024x2048, 19 classes, {runs} interleaved runs (reference: the mIoU accumulation)")
    for name, timing in times.items():
        print(_line(name, timing, times["mIoU"]))


def _volumes(shape=(128, 128, 128), classes=4, seed=0):
    rng = np.random.default_rng(seed)
    grids = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")
    target, pred = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    for c in range(1, classes):
        centre, radii = rng.uniform(0.3, 0.7, 3) * shape, rng.uniform(0.12, 0.3, 3) * shape
        for labels, r in ((target, radii), (pred, radii * rng.uniform(0.9, 1.1, 3))):
            labels[sum(((g - m) / q) ** 2 for g, m, q in zip(grids, centre, r)) <= 1] = c
    return pred, target


def bench_surface(runs: int) -> None:
    from monai.metrics import compute_hausdorff_distance, compute_surface_dice

    pred, target = _volumes()
    spacing = (1.5, 0.8, 0.8)
    one_hot = [torch.nn.functional.one_hot(torch.from_numpy(a), 4).movedim(-1, 0)[None].float() for a in (pred, target)]

    def ours():
        return hausdorff95(pred, target, 4, spacing=spacing), surface_dice(
            pred, target, 4, spacing=spacing, tolerance_mm=2.0
        )

    def one_pass():
        return surface_metrics(pred, target, 4, spacing=spacing, tolerance_mm=2.0)

    def monai():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hd = compute_hausdorff_distance(*one_hot, include_background=True, percentile=95, spacing=spacing)
            nsd = compute_surface_dice(*one_hot, [2.0] * 4, include_background=True, spacing=spacing)
        return hd, nsd

    (hd, nsd), (ref_hd, ref_nsd) = ours(), monai()
    assert np.allclose(hd.numpy(), ref_hd[0].numpy(), atol=1e-4) and np.allclose(nsd.numpy(), ref_nsd[0].numpy())
    assert all(torch.allclose(a, b, equal_nan=True) for a, b in zip(one_pass(), (hd, nsd)))
    calls = {"MONAI (two calls)": monai, "upzoo (two calls)": ours, "upzoo surface_metrics (one pass)": one_pass}
    times = compare_calls(calls, warmup=1, runs=runs)
    print(f"\nHD95 + surface Dice, 128^3, 4 classes, spacing {spacing}, {runs} interleaved runs (values equal)")
    for name, timing in times.items():
        print(_line(name, timing, times["MONAI (two calls)"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    bench_boundary(args.runs)
    bench_surface(args.runs)


if __name__ == "__main__":
    main()
