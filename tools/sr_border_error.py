"""Where a super-resolution run's output departs from the source at the image border.

A package photograph is degraded as training degrades (MATLAB bicubic by 1/scale), upscaled whole by
the run (upzoo.inference.upscale) and by bicubic interpolation, and the mean signed error against
the original is printed per row and column for the outermost pixels of each side, beside the
interior's. A negative error is darker than the source. The networks' convolutions pad with zeros
(as BasicSR's do), so a briefly trained network errs at the border more than inside.

    python tools/sr_border_error.py RUN [--image coffee] [--width 4]
"""

from __future__ import annotations

import argparse

import torch

from upzoo.data.bicubic import imresize
from upzoo.data.package_images import read_package_image
from upzoo.errors import UpzooError
from upzoo.inference import load_model, upscale


def side_errors(error: torch.Tensor, width: int) -> dict[str, list[float]]:
    """The mean signed error of each of the ``width`` outermost rows/columns per side (outside in)."""
    return {
        "top rows": error[:width].mean(1).tolist(),
        "bottom rows": error[-width:].mean(1).flip(0).tolist(),
        "left columns": error[:, :width].mean(0).tolist(),
        "right columns": error[:, -width:].mean(0).flip(0).tolist(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a super-resolution run folder (or its checkpoint)")
    parser.add_argument("--image", default="coffee", help="a package photograph by name [coffee]")
    parser.add_argument("--width", type=int, default=4, help="border pixels shown per side [4]")
    args = parser.parse_args()
    if args.width < 1:
        parser.error(f"--width: border pixels per side, at least 1, got {args.width}")
    try:
        loaded = load_model(args.run)
        photograph = read_package_image(args.image)
    except UpzooError as error:  # a missing run or an unknown photograph: one line
        parser.error(str(error))
    if loaded.recipe.task != "super_resolution":
        parser.error(f"{args.run} is a {loaded.recipe.task} run; pass a super-resolution run (upzoo train sr_*.yaml)")
    model, scale = loaded.model, int(loaded.spec.options["scale"])
    source = torch.from_numpy(photograph).permute(2, 0, 1).float() / 255
    height, width = (size // scale * scale for size in source.shape[1:])
    if min(height, width) < 4 * args.width:
        parser.error(f"--width {args.width} leaves no interior in a {height}x{width} photograph; use a smaller width")
    source = source[:, :height, :width]
    small = imresize(source, (height // scale, width // scale), 1 / scale).clamp(0, 1)
    outputs = {"network": upscale(model, small, scale), "bicubic": imresize(small, (height, width), scale).clamp(0, 1)}
    for name, output in outputs.items():
        error = (output - source).mean(0)  # over the channels
        inner = float(error[2 * args.width : -2 * args.width, 2 * args.width : -2 * args.width].mean())
        print(f"{name}: interior {inner:+.4f}")
        for side, values in side_errors(error, args.width).items():
            print(f"  {side:14s} (outermost first) " + " ".join(f"{v:+.4f}" for v in values))


if __name__ == "__main__":
    main()
