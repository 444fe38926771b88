"""Guided upsamplers against CARAFE (issue: guided upsamplers): forward+backward time and peak
memory of `fade` and `sapa` at 8x64x64x64 -> 128x128 with a 64-channel guide, and of `carafe` on
the same input, measured in the same run. Timing is interleaved (each round runs every block once),
median and interquartile range over the rounds; peak memory is the largest of three passes.

    python tools/bench_guided.py [--rounds 10] [--shape 8x64x64x64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from upzoo import create_upsampler
from upzoo.bench.memory import peak_memory

VARIANTS = [("carafe", {}), ("fade", {}), ("fade", {"gate": False}), ("sapa", {}), ("sapa", {"variant": "inner"})]


def _label(name: str, options: dict) -> str:
    return name + "".join(f" {k}={v}" for k, v in options.items())


def _step(name: str, options: dict, shape: tuple[int, ...]):
    b, c, h, w = shape
    guided = name != "carafe"
    extra = {"guide_channels": c} if guided else {}
    torch.manual_seed(0)
    block = create_upsampler(name, spatial_dims=2, in_channels=c, out_channels=c, scale=2, **extra, **options)
    x = torch.randn(*shape, requires_grad=True)
    guide = torch.randn(b, c, 2 * h, 2 * w)

    def run() -> None:
        y = block(x, guide) if guided else block(x)
        y.backward(torch.ones_like(y))
        block.zero_grad(set_to_none=True)
        x.grad = None

    return run


def report(steps: dict, rounds: int, reference: str) -> None:
    """Warm up, time ``steps`` in interleaved rounds, take the peak memory of each (largest of three
    passes), and print the table against ``reference``."""
    for run in steps.values():  # warm-up
        run()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for key, run in steps.items():
            start = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - start)
    memory = {k: max(peak_memory(run).mib for _ in range(3)) for k, run in steps.items()}
    base_t, base_m = statistics.median(times[reference]), memory[reference]
    print(f"| block | fwd+bwd ms | vs {reference} | peak MiB | vs {reference} |")
    print("|---|---|---|---|---|")
    for key, values in times.items():
        q1, _, q3 = statistics.quantiles(values, n=4)
        med = statistics.median(values)
        spread = " (spread > 20 %)" if (q3 - q1) / med > 0.2 else ""
        print(
            f"| {key} | {med * 1e3:.0f} ({q1 * 1e3:.0f}-{q3 * 1e3:.0f}){spread} | {med / base_t:.2f}x | "
            f"{memory[key]:.0f} | {memory[key] / base_m:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--shape", default="8x64x64x64")
    args = parser.parse_args()
    shape = tuple(int(v) for v in args.shape.split("x"))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; input {args.shape} -> x2 with a "
        f"{shape[1]}-channel guide; forward+backward, median (IQR) of {args.rounds} interleaved rounds\n"
    )
    report({_label(n, o): _step(n, o, shape) for n, o in VARIANTS}, args.rounds, "carafe")


if __name__ == "__main__":
    main()
