"""Scaling benchmark (issue: comparisons that outgrow one machine): 4 tiny cells of a comparison run
by the local launcher with ``--jobs 1`` (in this process, all threads) and with ``--jobs 2`` (two
worker processes, one thread each), interleaved ``--repeats`` times; the wall-clock ratio, and the
launcher's overhead per cell beyond the training itself (a cell's wall time minus the ``seconds``
its own summary reports for the training loop: interpreter start-up, imports, data and model set-up).

    python tools/bench_scaling.py [--steps 40] [--repeats 2]

Run it alone: other processes on the cores distort multi-threaded PyTorch several-fold.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

from conftest import small_recipe  # noqa: E402
from upzoo.bench.launchers import launch_local  # noqa: E402
from upzoo.bench.plan import plan_comparison, write_plan  # noqa: E402
from upzoo.bench.variants import parse_variants  # noqa: E402
from upzoo.recipe import parse_recipe  # noqa: E402


def run(jobs: int, steps: int, cache: Path) -> tuple[float, list[float]]:
    """Wall seconds of the 4 cells and each cell's overhead beyond its training loop."""
    data = {"synthetic_size": [64, 128], "crop_size": [64, 64]}
    train = {"max_steps": steps, "log_every": steps}
    recipe = parse_recipe(small_recipe(cache, model={"channels": [8, 16, 32]}, data=data, train=train))
    with tempfile.TemporaryDirectory() as out:
        plan = plan_comparison(recipe, parse_variants("transposed,interpolate"), out, seeds=2)
        write_plan(plan, out)
        start = time.perf_counter()
        results = launch_local(plan, jobs=jobs, echo=lambda _: None, progress=False)
        wall = time.perf_counter() - start
        overheads = []
        for result in results:
            assert result.status == "done", result.error
            trained = json.loads((Path(result.cell.folder) / "summary.json").read_text())["seconds"]
            overheads.append(result.seconds - trained)
    return wall, overheads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="upzoo-scaling-"))
    run(1, 2, cache)  # generate the data once, warm the caches
    walls: dict[int, list[float]] = {1: [], 2: []}
    overheads: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.repeats):
        for jobs in (1, 2):
            wall, over = run(jobs, args.steps, cache)
            walls[jobs].append(wall)
            overheads[jobs] += over
    print(f"torch {torch.__version__}, {os.cpu_count()} cores; 4 cells of {args.steps} steps, {args.repeats} repeats\n")
    print("| launcher | wall s (median, min-max) | overhead per cell s (median, max) |")
    print("|---|---|---|")
    for jobs, label in ((1, "--jobs 1 (in-process, 2 threads)"), (2, "--jobs 2 (2 workers, 1 thread each)")):
        w, o = walls[jobs], overheads[jobs]
        print(f"| {label} | {statistics.median(w):.1f} ({min(w):.1f}-{max(w):.1f}) | "
              f"{statistics.median(o):.2f} ({max(o):.2f}) |")  # fmt: skip
    ratio = statistics.median(walls[1]) / statistics.median(walls[2])
    print(f"\nwall-clock ratio --jobs 1 / --jobs 2: {ratio:.2f}x (ideal on 2 cores: 2.0x when one training cannot use")
    print("the second core, 1.0x when it uses both fully)")


if __name__ == "__main__":
    main()
