"""upzoo's smp decoders against smp's own models (issue: the upsampler in every decoder): forward +
backward time of ``smp_fpn``/``smp_upernet``/``smp_segformer``/``smp_deeplabv3plus`` with smp's resize
at every point (``upsampler="interpolate"``) against the smp model with the same weights, interleaved
in the same run (each round runs every model once), median and interquartile range over the rounds,
and the ratio of the medians. Also each decoder with DySample at every point but the head, for scale.

    python tools/bench_decoders.py [--rounds 15] [--shape 4x3x256x512] [--threads 2]
"""

from __future__ import annotations

import argparse

import segmentation_models_pytorch as smp
import torch

from upzoo.bench.speed import compare_calls
from upzoo.models import smp_deeplabv3plus, smp_fpn, smp_segformer, smp_upernet

DECODERS = [
    ("FPN", smp_fpn, smp.FPN, "resnet18"),
    ("UPerNet", smp_upernet, smp.UPerNet, "resnet18"),
    ("SegFormer", smp_segformer, smp.Segformer, "mit_b0"),
    ("DeepLabV3+", smp_deeplabv3plus, smp.DeepLabV3Plus, "resnet18"),
]


def _step(model: torch.nn.Module, x: torch.Tensor):
    model.train()

    def run() -> None:
        y = model(x)
        y.backward(torch.ones_like(y))
        model.zero_grad(set_to_none=True)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--shape", default="4x3x256x512")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = tuple(int(v) for v in args.shape.split("x"))
    x = torch.randn(*shape)
    steps = {}
    for label, ours_builder, smp_class, encoder in DECODERS:
        torch.manual_seed(0)
        reference = smp_class(encoder_name=encoder, encoder_weights=None, classes=19)
        ours = ours_builder(encoder, upsampler="interpolate", classes=19)
        ours.load_state_dict(reference.state_dict(), strict=True)
        steps[f"{label} smp"] = _step(reference, x)
        steps[f"{label} upzoo"] = _step(ours, x)
        steps[f"{label} upzoo dysample"] = _step(ours_builder(encoder, upsampler="dysample", classes=19), x)
    timings = compare_calls(steps, warmup=1, runs=args.rounds)  # interleaved: noise hits all alike
    print(
        f"forward+backward, train mode, input {args.shape}, {args.threads} threads, {args.rounds} interleaved rounds\n"
    )
    print("| decoder | smp (ms, median [IQR]) | upzoo, smp's resize | ratio | upzoo, DySample | ratio |")
    print("|---|---|---|---|---|---|")
    for label, *_ in DECODERS:
        cells, base = [], None
        for key in (f"{label} smp", f"{label} upzoo", f"{label} upzoo dysample"):
            t = timings[key]
            q1, median, q3 = 1000 * t.q1, 1000 * t.median, 1000 * t.q3
            base = base or median
            cells.append(f"{median:.1f} [{q1:.1f}-{q3:.1f}]")
            if key != f"{label} smp":
                cells.append(f"{median / base:.3f}x")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
