"""Shapes benchmark (issue: upzoo shapes).

Every valid size from 256 to 2048 on one axis of a resnet34 U-Net: the analytic solver vs trying
each size on the meta device, side by side, with the answers compared. The trial runs the network
with its own size check switched off, so the network itself fails on an invalid size (a mismatched
skip concatenation), as any hand-written U-Net would; a second row tries each size against the
model's strict input check, which fails fast before running anything.

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
        net = UNet(
            spatial_dims=2,
            in_channels=3,
            num_classes=19,
            encoder="resnet34",
            upsampler="interp_conv",
            input_policy="strict",
        ).eval()

    start = time.perf_counter()
    solver = ShapeSolver(net)
    analytic = solver.valid_sizes(1, args.low, args.high)
    t_solver = time.perf_counter() - start

    def trial() -> tuple[list[int], float]:
        start = time.perf_counter()
        found = []
        with torch.no_grad():
            for n in range(args.low, args.high + 1):
                try:
                    if net(torch.empty(1, 3, 512, n, device="meta")).shape[-1] == n:
                        found.append(n)
                except (ShapeError, RuntimeError):
                    pass
        return found, time.perf_counter() - start

    strict, t_strict = trial()
    net.padded_size = lambda spatial: tuple(spatial)  # no check, no padding: the network decides
    native, t_native = trial()
    print(f"torch {torch.__version__}; resnet34 U-Net, axis 1, sizes {args.low}..{args.high}\n")
    print("| method | valid sizes found | seconds | solver speed-up |")
    print("|---|---|---|---|")
    print(f"| analytic solver ({solver.path}) | {len(analytic)} | {t_solver:.3f} | 1x |")
    print(
        f"| meta-device trial of every size, network decides | {len(native)} | {t_native:.1f} | "
        f"{t_native / t_solver:.0f}x |"
    )
    print(
        f"| meta-device trial of every size, strict input check | {len(strict)} | {t_strict:.2f} | "
        f"{t_strict / t_solver:.0f}x |"
    )
    print(f"\nsame answers: {analytic == native == strict}; rule: {solver.rule(1).describe()}")


if __name__ == "__main__":
    main()
