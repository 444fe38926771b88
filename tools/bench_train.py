"""Training benchmark (issue: train): the quickstart's training throughput through `upzoo train`
vs a hand-written minimal PyTorch loop training the same model on the same data and pipeline, in
the same run. Both are measured over the same steady-state window (steps after warm-up).

    python tools/bench_train.py [--steps 40] [--warmup 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from upzoo.data.factory import build_datasets
from upzoo.models import build_model
from upzoo.recipe import load_recipe
from upzoo.runtime import StopFlag
from upzoo.train.engine import train

ROOT = Path(__file__).resolve().parents[1]


def upzoo_rate(recipe, steps: int, warmup: int) -> float:
    marks = {}

    def on_step(step, loss, stop: StopFlag):
        if step in (warmup, steps):
            marks[step] = time.perf_counter()

    with tempfile.TemporaryDirectory() as run:
        train(recipe, run, progress=False, on_step=on_step)
    return (steps - warmup) * recipe.data.batch_size / (marks[steps] - marks[warmup])


def hand_written_rate(recipe, steps: int, warmup: int) -> float:
    torch.manual_seed(recipe.train.seed)
    bundle = build_datasets(recipe.data, task="segmentation", num_classes=19)
    model = build_model(recipe.model)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.train.lr, weight_decay=recipe.train.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (1 - min(s, steps) / steps) ** 0.9)
    loader = DataLoader(
        bundle.train,
        batch_size=recipe.data.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=recipe.data.num_workers,
    )
    step, start = 0, None
    model.train()
    while step < steps:
        for batch in loader:
            loss = F.cross_entropy(model(batch["image"]), batch["mask"], ignore_index=255)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step == warmup:
                start = time.perf_counter()
            if step == steps:
                break
    return (steps - warmup) * recipe.data.batch_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="alternate the two loops this many times each")
    args = parser.parse_args()
    recipe = load_recipe(
        ROOT / "recipes" / "quickstart.yaml",
        [f"train.max_steps={args.steps}", "train.val_every=100000", "train.checkpoint_every=100000"],
    )
    ours, hand = [], []
    for _ in range(args.repeats):
        ours.append(upzoo_rate(recipe, args.steps, args.warmup))
        hand.append(hand_written_rate(recipe, args.steps, args.warmup))
    ratios = sorted(o / h for o, h in zip(ours, hand))  # each pair measured back to back
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; quickstart recipe, steps "
        f"{args.warmup}..{args.steps}, {args.repeats} interleaved pairs (median, min-max)\n"
    )
    print("| loop | images/s | ratio to the hand-written loop |")
    print("|---|---|---|")
    print(f"| hand-written PyTorch loop | {statistics.median(hand):.2f} ({min(hand):.2f}-{max(hand):.2f}) | 1.00 |")
    print(
        f"| upzoo train (the engine) | {statistics.median(ours):.2f} ({min(ours):.2f}-{max(ours):.2f}) | "
        f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f}) |"
    )


if __name__ == "__main__":
    main()
