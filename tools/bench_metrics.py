"""Metrics benchmark (issue: measurement).

mIoU accumulation over 8 label maps of 1024x2048 with 19 classes (10 % ignored pixels): upzoo's
ConfusionMatrix vs torchmetrics' MulticlassJaccardIndex (with and without validate_args), side by
side with identical numbers checked, and the achieved bytes/s against this machine's memory-copy
bandwidth.

    python tools/bench_metrics.py [--runs 5]
"""

from __future__ import annotations

import argparse

import torch
from torchmetrics.classification import MulticlassJaccardIndex

from upzoo.bench.speed import compare_calls, memcpy_bandwidth
from upzoo.metrics import ConfusionMatrix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    k = 19
    target = torch.randint(0, k, (8, 1024, 2048), generator=g)
    target[torch.rand(target.shape, generator=g) < 0.1] = 255
    pred = torch.randint(0, k, (8, 1024, 2048), generator=g)
    results = {}

    def ours():
        acc = ConfusionMatrix(k, 255)
        for p, t in zip(pred, target):
            acc.update(p, t)
        results["ours"] = torch.tensor(acc.compute()["per_class_iou"], dtype=torch.float64)

    def reference(validate):
        def run():
            metric = MulticlassJaccardIndex(k, ignore_index=255, average="none", validate_args=validate)
            for p, t in zip(pred, target):
                metric.update(p, t)
            results[f"tm{validate}"] = metric.compute().double()

        return run

    t = compare_calls({"upzoo": ours, "tm": reference(True), "tm_fast": reference(False)}, warmup=1, runs=args.runs)
    same = all(torch.allclose(results["ours"], results[key], atol=1e-6) for key in ("tmTrue", "tmFalse"))
    bandwidth = memcpy_bandwidth()
    traffic = pred.numel() * (pred.element_size() + target.element_size())  # each label read once
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; 8 x 1024 x 2048, 19 classes, "
        f"median of {args.runs}\n"
    )
    print("| method | seconds | upzoo speed-up | bytes/s vs memcpy |")
    print("|---|---|---|---|")
    for name, label in (
        ("upzoo", "upzoo ConfusionMatrix"),
        ("tm", "torchmetrics MulticlassJaccardIndex"),
        ("tm_fast", "torchmetrics, validate_args=False"),
    ):
        seconds = t[name].median
        print(f"| {label} | {seconds:.3f} | {seconds / t['upzoo'].median:.2f}x | {traffic / seconds / bandwidth:.0%} |")
    print(
        f"\nidentical per-class IoU: {same}; memory-copy bandwidth {bandwidth / 1e9:.1f} GB/s "
        f"(bytes counted: both int64 label maps read once)"
    )


if __name__ == "__main__":
    main()
