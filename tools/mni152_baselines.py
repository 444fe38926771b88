"""Through-plane interpolation on a real brain: how close linear, cubic-convolution and cubic B-spline
interpolation of thick slices come to the 1 mm MNI152 T1 template, inside the brain mask.

Thick axial slices of 3, 4 and 5 mm are made as a scanner makes them (each the mean of its thin
slices, upzoo.data.slabs), without and with Gaussian noise; each is interpolated back to 1 mm and
scored with PSNR and 3D SSIM inside the brain (upzoo.metrics.volume_quality). These are the rows a
learned through-plane upsampler has to beat. Also times the data step: reading the template and
labelling its tissue, making the slabs, and each interpolation.

    python tools/mni152_baselines.py [--noise 0.02]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from upzoo.data.mni152 import TISSUE_NAMES, load_mni152
from upzoo.data.slabs import SLICE_INTERPOLATIONS, interpolate_slices, thick_slices
from upzoo.metrics.volume_quality import masked_psnr, masked_ssim

AXIAL_SLICES = 180  # the template's 189 axial slices cropped to a multiple of 3, 4 and 5 (the top 9 are empty)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, default=0.02, help="noise std of the noisy rows (T1 in [0, 1])")
    args = parser.parse_args()
    start = time.perf_counter()
    brain = load_mni152()
    loaded = time.perf_counter() - start
    counts = np.bincount(brain.labels.ravel(), minlength=len(TISSUE_NAMES))
    print(f"template {brain.t1.shape} at {brain.spacing} mm read and labelled in {loaded:.2f} s; voxels per class: "
          + ", ".join(f"{n} {c}" for n, c in zip(TISSUE_NAMES, counts)))  # fmt: skip
    t1, mask = brain.t1[:AXIAL_SLICES], brain.mask[:AXIAL_SLICES]
    print("\n| slices | noise | interpolation | PSNR in brain (dB) | SSIM in brain | interpolation s |")
    print("|---|---|---|---|---|---|")
    for factor in (3, 4, 5):
        for noise in (0.0, args.noise):
            start = time.perf_counter()
            thick = thick_slices(t1, factor, noise=noise, seed=0)
            slab_s = time.perf_counter() - start
            for method in SLICE_INTERPOLATIONS:
                start = time.perf_counter()
                thin = interpolate_slices(thick, factor, method)
                seconds = time.perf_counter() - start
                print(f"| {factor} mm | {noise:g} | {method} | {masked_psnr(thin, t1, mask):.2f} | "
                      f"{masked_ssim(thin, t1, mask):.4f} | {seconds:.2f} |")  # fmt: skip
            print(f"|  |  | (making the slabs: {slab_s:.3f} s) |  |  |  |")


if __name__ == "__main__":
    main()
