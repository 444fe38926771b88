"""How far the README's quickstart figures move with the seed and the CPU's kernels: trains
``recipes/quickstart.yaml`` once per (CPU capability, seed) with ``upzoo train``, each in a new
process (``ATEN_CPU_CAPABILITY`` is read when PyTorch starts), and prints one row per run and the
range of each figure: the spread the README states.

    python tools/quickstart_spread.py [--seeds 0,1,2] [--kernels default,avx2,native] [--out runs/spread]

``native`` leaves ``ATEN_CPU_CAPABILITY`` unset (the best kernels this CPU has). Run it alone: the
figures do not depend on timing, but each run takes about 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("miou", "classes_over_0.2", "boundary_iou", "boundary_fscore", "pixel_accuracy")


def train_once(kernel: str, seed: int, out: Path) -> dict:
    env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if kernel != "native":
        env["ATEN_CPU_CAPABILITY"] = kernel
    folder = out / f"{kernel}-seed{seed}"
    if not (folder / "summary.json").is_file():
        command = [sys.executable, "-m", "upzoo", "train", str(ROOT / "recipes/quickstart.yaml"), "--out", str(folder),
                   "--continue", "--set", f"train.seed={seed}", "--no-progress"]  # fmt: skip
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((folder / "summary.json").read_text())
    val = summary["val"]
    per_class = val["per_class_iou"]
    values = per_class.values() if isinstance(per_class, dict) else per_class
    return {
        "kernel": summary["machine"]["cpu_capability"],
        "seed": seed,
        "miou": val["miou"],
        "classes_over_0.2": sum(1 for v in values if v is not None and v >= 0.2),
        "boundary_iou": val["boundary_iou"],
        "boundary_fscore": val["boundary_fscore"],
        "pixel_accuracy": val["pixel_accuracy"],
        "seconds": summary["seconds"],
        "cpu": summary["machine"]["cpu"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--kernels", default="default,avx2,native")
    parser.add_argument("--out", default="runs/spread")
    args = parser.parse_args()
    out = Path(args.out)
    rows = []
    for kernel in args.kernels.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            print(f"training: kernels {kernel}, seed {seed} ...", file=sys.stderr, flush=True)
            rows.append(train_once(kernel, seed, out))
    print(f"CPU: {rows[0]['cpu']}\n")
    print("| kernels | seed | mIoU (19 classes) | classes IoU >= 0.2 | Boundary IoU | boundary F | pixel acc | s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kernel']} | {r['seed']} | {r['miou']:.3f} | {r['classes_over_0.2']} | {r['boundary_iou']:.3f} "
              f"| {r['boundary_fscore']:.3f} | {r['pixel_accuracy']:.3f} | {r['seconds']:.0f} |")  # fmt: skip
    print()
    for key in FIGURES:
        values = [r[key] for r in rows]
        print(f"{key}: {min(values):.3f} - {max(values):.3f} over {len(rows)} runs")


if __name__ == "__main__":
    main()
