"""Shapes benchmark (issue: upzoo shapes).

Every valid size from 256 to 2048 on one axis of a resnet34 U-Net (strict input policy, so an
invalid size fails for real): the analytic solver vs trying each size on the meta device, side by
side, with the two answers compared.

    python tools/bench_shapes.py [--low 256] [--high 2048]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import torch

from upzoo import UNet
from upzoo.errors import ShapeError
from upzoo.shapes import ShapeSolver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--low", type=int, default=256)
    parser.add_argument("--high", type=int, default=2048)
    args = parser.parse_args()
    with torch.device("meta"):
        net = UNet(spatial_dims=2, in_channels=3, num_classes=19, encoder="resnet34", upsampler="interp_conv",
                   input_policy="strict").eval()

    start = time.perf_counter()
    solver = ShapeSolver(net)
    analytic = solver.valid_sizes(1, args.low, args.high)
    t_solver = time.perf_counter() - start

    start = time.perf_counter()
    probed = []
    with torch.no_grad():
        for n in range(args.low, args.high + 1):
            try:
                out = net(torch.empty(1, 3, 512, n, device="meta"))
                if out.shape[-1] == n:
                    probed.append(n)
            except (ShapeError, RuntimeError):
                pass
    t_probe = time.perf_counter() - start
    print(f"torch {torch.__version__}; resnet34 U-Net, axis 1, sizes {args.low}..{args.high}\n")
    print("| method | valid sizes found | seconds | speed-up |")
    print("|---|---|---|---|")
    print(f"| analytic solver ({solver.path}) | {len(analytic)} | {t_solver:.3f} | {t_probe / t_solver:.0f}x |")
    print(f"| meta-device trial of every size | {len(probed)} | {t_probe:.1f} | 1x |")
    print(f"\nsame answer: {analytic == probed}; rule: {solver.rule(1).describe()}")


if __name__ == "__main__":
    main()
