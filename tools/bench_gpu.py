"""The GPU record for docs/benchmarks.md, in one run of at most 8 minutes (``tools/bench_gpu.sh``):

1. every 2D block at 1024x2048 output (input 1x32x512x1024, x2) under bf16 autocast: forward FPS,
   forward+backward time and peak memory (``torch.cuda.max_memory_allocated``);
2. the quickstart's throughput: ``upzoo train recipes/quickstart.yaml`` for ``--steps`` steps on one
   GPU (samples/s from its metrics.csv, the first logged rows left out as warm-up);
3. torch.compile's speed-up on the quickstart U-Net (inference and a training step, interleaved with
   eager, median and interquartile range);
4. a two-process DDP run of the same steps (``--nproc 2``) when two GPUs are present, else a line
   saying it was skipped and why.

    python tools/bench_gpu.py [--device cuda] [--steps 200] [--rounds 20] [--quick]

``--quick`` (tiny sizes, a few steps, runs on the CPU too) checks that the script works; its figures
mean nothing. Every section prints its own table; a section that fails prints its one-line error
and the others still run.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _spread(values: list[float]) -> str:
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) >= 4 else (min(values), 0, max(values))
    return f"{statistics.median(values) * 1e3:.1f} (IQR {q1 * 1e3:.1f}-{q3 * 1e3:.1f}) ms"


def blocks(device: str, shape: tuple[int, ...], runs: int) -> None:
    """One row per block; a block that does not fit (an attention over every input position at this
    size) gets its row with the reason, and the others still run."""
    from upzoo import list_upsamplers
    from upzoo.bench.block_table import bench_blocks
    from upzoo.errors import UpzooError

    print(f"\n## 1. blocks at {shape} -> x2, bf16 autocast, median of {runs}\n")
    print("| block | forward FPS | fwd+bwd ms | peak MiB (fwd+bwd) |\n|---|---|---|---|")
    for name in list_upsamplers(kind="upsampler"):
        try:
            rows = bench_blocks(shape, scale=2, device=device, runs=runs, amp="bf16", names=[name])
        except (torch.OutOfMemoryError, UpzooError) as error:
            torch.cuda.empty_cache()
            reason = "out of memory" if isinstance(error, torch.OutOfMemoryError) else str(error).split(";")[0]
            print(f"| {name} | {reason} | | |")
            continue
        for row in rows:
            fps = shape[0] / (row["forward_ms"] / 1e3)
            print(f"| {row['block']} | {fps:.1f} | {row['fwd_bwd_ms']:.2f} | {row['peak_mib']:.0f} |", flush=True)


def _train(device: str, steps: int, nproc: int, out: Path, quick: bool) -> float:
    """Samples/s over all ranks of ``steps`` quickstart steps (the mean of the logged rows after the
    first fifth)."""
    sets = [f"train.device={device}", f"train.max_steps={steps}", "train.val_every=null", "train.log_every=5"]
    if quick:
        sets += ["data.synthetic_train=8", "data.synthetic_val=2", "data.synthetic_size=[32,64]",
                 "data.crop_size=[32,64]", "train.warmup_steps=0", "train.log_every=1"]  # fmt: skip
    command = [sys.executable, "-m", "upzoo", "train", str(ROOT / "recipes/quickstart.yaml"), "--out", str(out),
               "--nproc", str(nproc), "--no-progress"] + [a for s in sets for a in ("--set", s)]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    with open(out / "metrics.csv") as rows:
        rates = [float(r["samples_per_s"]) for r in csv.DictReader(rows) if r.get("samples_per_s")]
    return statistics.fmean(rates[len(rates) // 5 :] or rates)


def throughput(device: str, steps: int, quick: bool, tmp: Path) -> float:
    print(f"\n## 2. quickstart training throughput, {steps} steps, one {device} device\n")
    rate = _train(device, steps, 1, tmp / "one", quick)
    print(f"{rate:.1f} samples/s (batch 4 at 128x256; the first fifth of the logged steps left out)")
    return rate


def compiled(device: str, rounds: int, quick: bool) -> None:
    from upzoo.models import build_model
    from upzoo.prepare import resolve_model
    from upzoo.recipe import load_recipe

    model = build_model(resolve_model(load_recipe(ROOT / "recipes/quickstart.yaml"))).to(device)
    x = torch.randn(4, 3, *((32, 64) if quick else (128, 256)), device=device)
    fast = torch.compile(model)

    def infer(m):
        def run():
            with torch.no_grad():
                m(x)

        return run

    def step(m):
        def run():
            m(x).float().mean().backward()

        return run

    print(f"\n## 3. torch.compile (inductor) vs eager, quickstart U-Net at {tuple(x.shape)}, {rounds} rounds\n")
    print("| pass | eager | compiled | speed-up |\n|---|---|---|---|")
    for name, make in (("inference", infer), ("training step", step)):
        calls = {"eager": make(model), "compiled": make(fast)}
        times = _interleaved(calls, rounds, device)
        speedup = statistics.median(times["eager"]) / statistics.median(times["compiled"])
        print(f"| {name} | {_spread(times['eager'])} | {_spread(times['compiled'])} | {speedup:.2f}x |")


def _interleaved(calls: dict, rounds: int, device: str) -> dict[str, list[float]]:
    from upzoo.bench.speed import synchronize

    for call in calls.values():  # warm-up (and compilation)
        call(), call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            synchronize(device)
            start = time.perf_counter()
            call()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


def ddp(device: str, steps: int, quick: bool, tmp: Path, single: float | None) -> None:
    print("\n## 4. two-process DDP (upzoo train --nproc 2)\n")
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    if device == "cuda" and gpus < 2:
        print(f"skipped: {gpus} GPU visible here, a two-process DDP run on CUDA needs 2")
        return
    rate = _train(device, steps, 2, tmp / "ddp", quick)
    versus = f", {rate / single:.2f}x one process" if single else ""
    print(f"{rate:.1f} samples/s over both ranks (batch 4 each){versus}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script, not the GPU")
    args = parser.parse_args()
    from upzoo.bench.block_table import environment_line

    print(environment_line(args.device))
    shape = (1, 8, 16, 32) if args.quick else (1, 32, 512, 1024)
    single = None
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        sections = [
            lambda: blocks(args.device, shape, 3 if args.quick else 10),
            lambda: throughput(args.device, args.steps, args.quick, tmp),
            lambda: compiled(args.device, args.rounds, args.quick),
            lambda: ddp(args.device, args.steps, args.quick, tmp, single),
        ]
        for index, section in enumerate(sections):
            try:
                result = section()
            except Exception as error:  # noqa: BLE001 - one section's failure must not hide the others
                print(f"section {index + 1} failed: {type(error).__name__}: {str(error).splitlines()[0]}")
                continue
            if index == 1:
                single = result


if __name__ == "__main__":
    main()
