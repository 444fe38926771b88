"""`fir` against the blocks it stands in for: forward+backward time and peak memory at
8x64x64x64 -> 128x128, 64 -> 64 channels, of `fir` (zero insertion + [1, 3, 3, 1] low-pass + 3x3
conv) and of `interp_conv` (nearest and bilinear + 3x3 conv), `transposed` (k4 s2 p1) and
`pixel_shuffle`, measured in the same run, interleaved; `interp_conv` nearest is the reference.

    python tools/bench_fir.py [--rounds 10] [--shape 8x64x64x64]
"""

from __future__ import annotations

import argparse

import torch
from bench_guided import report  # tools/ is the script's own folder

from upzoo import create_upsampler

VARIANTS = {
    "interp_conv": ("interp_conv", {}),
    "interp_conv bilinear": ("interp_conv", {"mode": "bilinear"}),
    "fir": ("fir", {}),
    "fir kernel_size=None": ("fir", {"kernel_size": None}),
    "transposed k4 p1": ("transposed", {"kernel_size": 4, "padding": 1}),
    "pixel_shuffle": ("pixel_shuffle", {}),
}


def _step(name: str, options: dict, shape: tuple[int, ...]):
    torch.manual_seed(0)
    block = create_upsampler(name, spatial_dims=2, in_channels=shape[1], out_channels=shape[1], scale=2, **options)
    x = torch.randn(*shape, requires_grad=True)

    def run() -> None:
        y = block(x)
        y.backward(torch.ones_like(y))
        block.zero_grad(set_to_none=True)
        x.grad = None

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--shape", default="8x64x64x64")
    args = parser.parse_args()
    shape = tuple(int(v) for v in args.shape.split("x"))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; input {args.shape} -> x2; "
        f"forward+backward, median (IQR) of {args.rounds} interleaved rounds\n"
    )
    report({key: _step(n, o, shape) for key, (n, o) in VARIANTS.items()}, args.rounds, "interp_conv")


if __name__ == "__main__":
    main()
