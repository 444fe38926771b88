"""PSNR and SSIM (Y channel, border 4 cropped, BasicSR's conventions) of 100 image pairs of 512x512:
``upzoo.metrics.psnr_ssim`` on the whole batch (float64; OpenCV's separable Gaussian) against the per-image OpenCV
definition that BasicSR uses (``cv2.filter2D`` with the 11x11 window), timed interleaved in the
same run; the figures must agree to 1e-6.

    python tools/bench_image_quality.py [--rounds 5] [--images 100] [--size 512]
"""

from __future__ import annotations

import argparse
import statistics
import time

import cv2
import numpy as np
import torch

from upzoo.metrics import psnr_ssim


def _basicsr_like(outputs: np.ndarray, targets: np.ndarray, crop: int) -> tuple[float, float]:
    """BasicSR's per-image loop: Y channel in float32 steps, PSNR, SSIM with cv2.filter2D."""
    kernel = cv2.getGaussianKernel(11, 1.5)
    window = np.outer(kernel, kernel.T)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    psnrs, ssims = [], []
    for out, tgt in zip(outputs, targets):
        a, b = (np.dot(x[crop:-crop, crop:-crop].astype(np.float32) / 255.0, [65.481, 128.553, 24.966]) + 16.0
                for x in (out, tgt))  # fmt: skip
        a, b = ((x / 255.0).astype(np.float32) * 255.0 for x in (a, b))
        a, b = a.astype(np.float64), b.astype(np.float64)
        psnrs.append(10 * np.log10(255.0**2 / np.mean((a - b) ** 2)))
        mu1, mu2 = (cv2.filter2D(x, -1, window)[5:-5, 5:-5] for x in (a, b))
        s1 = cv2.filter2D(a * a, -1, window)[5:-5, 5:-5] - mu1**2
        s2 = cv2.filter2D(b * b, -1, window)[5:-5, 5:-5] - mu2**2
        s12 = cv2.filter2D(a * b, -1, window)[5:-5, 5:-5] - mu1 * mu2
        ssims.append((((2 * mu1 * mu2 + c1) * (2 * s12 + c2)) / ((mu1**2 + mu2**2 + c1) * (s1 + s2 + c2))).mean())
    return float(np.mean(psnrs)), float(np.mean(ssims))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--size", type=int, default=512)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 256, (args.images, args.size, args.size, 3), dtype=np.uint8)
    noise = rng.normal(0, 8, targets.shape)
    outputs = np.clip(targets + noise, 0, 255).round().astype(np.uint8)
    out_t, tgt_t = (torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255 for x in (outputs, targets))
    results: dict[str, tuple[float, float]] = {}

    def ours() -> None:
        values = psnr_ssim(out_t, tgt_t, crop_border=4, y_channel=True)
        results["upzoo"] = (float(values[0].mean()), float(values[1].mean()))

    def reference() -> None:
        results["BasicSR-style OpenCV loop"] = _basicsr_like(outputs, targets, 4)

    steps = {"upzoo": ours, "BasicSR-style OpenCV loop": reference}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for run in steps.values():
        run()
    for _ in range(args.rounds):
        for key, run in steps.items():
            start = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - start)
    base = statistics.median(times["BasicSR-style OpenCV loop"])
    print(f"{args.images} pairs of {args.size}x{args.size}, PSNR + SSIM on Y, {torch.get_num_threads()} threads")
    print("| implementation | s (median, min-max) | vs OpenCV loop | mean PSNR | mean SSIM |")
    print("|---|---|---|---|---|")
    for key, values in times.items():
        med = statistics.median(values)
        print(f"| {key} | {med:.2f} ({min(values):.2f}-{max(values):.2f}) | {med / base:.2f}x | "
              f"{results[key][0]:.6f} | {results[key][1]:.6f} |")  # fmt: skip
    difference = [abs(a - b) for a, b in zip(results["upzoo"], results["BasicSR-style OpenCV loop"])]
    print(f"max |upzoo - reference| over the two means: {max(difference):.1e}")


if __name__ == "__main__":
    main()
