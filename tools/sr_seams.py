"""What a halo smaller than the receptive radius costs: seams of a shipped SR network in tiles.

One photograph (a 256x256 crop of scikit-image's astronaut by default) is upscaled whole, then in
tiles with halos from Real-ESRGAN's default ``tile_pad`` (10) up to the network's declared receptive
radius (``upzoo upscale --tile`` uses that, and refuses less). Prints the seconds of each and the
largest and mean absolute difference to the whole output (on [0, 1]; 1/255 is one 8-bit step).

    python tools/sr_seams.py [--weights realesrgan-x4plus] [--size 256] [--tile 96] [--halos 10,32,64]
"""

from __future__ import annotations

import argparse
import time

import torch

from upzoo.data.package_images import read_package_image
from upzoo.inference.tiled_upscaling import tiled_output
from upzoo.machine import machine_record
from upzoo.models.sr_weights import load_sr_weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="realesrgan-x4plus")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--tile", type=int, default=96, help="tile core in input pixels (the halo is added)")
    parser.add_argument("--halos", default="10,32,64")
    args = parser.parse_args()
    network = load_sr_weights(args.weights)
    pixels = torch.from_numpy(read_package_image("astronaut")).permute(2, 0, 1).float() / 255
    image = pixels[:, : args.size, 128 : 128 + args.size].contiguous()
    print(f"machine: {machine_record()['cpu']}; {args.weights} x{network.scale} on a {args.size}x{args.size} crop "
          f"of astronaut; declared receptive radius {network.receptive_radius_bound}\n")  # fmt: skip
    start = time.perf_counter()
    with torch.no_grad():
        whole = tiled_output(network, image, network.scale, None, 0, torch.device("cpu"))
    print(f"whole: {time.perf_counter() - start:.1f} s\n")
    print("| halo (input px) | tile read (px) | seconds | max abs diff | mean abs diff | pixels off by >= 1/255 |")
    print("|---|---|---|---|---|---|")
    for halo in (int(h) for h in args.halos.split(",")):
        start = time.perf_counter()
        with torch.no_grad():  # tiled_output takes any halo: this measures what too small a one does
            tiled = tiled_output(network, image, network.scale, args.tile + 2 * halo, halo, torch.device("cpu"))
        seconds = time.perf_counter() - start
        diff = (tiled - whole).abs()
        off = float((diff >= 1 / 255).float().mean())
        print(f"| {halo} | {args.tile + 2 * halo} | {seconds:.1f} | {float(diff.max()):.2e} | {float(diff.mean()):.2e} "
              f"| {off:.2%} |")  # fmt: skip


if __name__ == "__main__":
    main()
