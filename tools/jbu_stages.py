"""JBU stage by stage at the probe's ratio: what each x2 stage does to the features' size.

For trained ``feature_upsampler`` runs of JBU (and an untrained JBU of the same shape), on the first
validation scenes of the run's recipe, with the full-resolution image as the guide (as the linear
probe uses it): per stage, the mean / min / max sum of the kernels over their window, the features'
spatial standard deviation and mean relative to bilinear's at the same size, and the cosine
similarity to bilinear's. A kernel that does not sum to 1 scales the features at every stage, and
the stages compound it.

    python tools/jbu_stages.py runs/featup-jbu [runs/featup-jbu-image ...] [--images 4]
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F

from upzoo.prepare import prepare
from upzoo.registry import create_upsampler
from upzoo.runs import load_model
from upzoo.upsamplers.jbu import stage_factors


@torch.no_grad()
def stage_rows(model: torch.nn.Module, images: torch.Tensor) -> list[tuple[float, ...]]:
    """One row per stage: kernel sum mean, min, max; std and mean ratios to bilinear; cosine."""
    up, features = model.upsampler, model.backbone(images)
    stride = model.backbone.stride
    remaining, x, rows = [stride, stride], features, []
    for factor in stage_factors((stride, stride)):
        remaining = [remaining[a] // factor[a] for a in range(2)]
        last = max(remaining) == 1
        guide = images if last else F.avg_pool2d(images, remaining, remaining)
        sums = up.kernel(guide, None).sum(1)
        x = up.stage(x, guide, factor, last=last)
        reference = F.interpolate(features, size=x.shape[-2:], mode="bilinear", align_corners=False)
        std = float(x.std((2, 3)).mean() / reference.std((2, 3)).mean())
        mean = float(x.mean() / reference.mean())
        cosine = float(F.cosine_similarity(x, reference, dim=1).mean())
        rows.append((float(sums.mean()), float(sums.min()), float(sums.max()), std, mean, cosine))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="feature_upsampler run folders of JBU")
    parser.add_argument("--images", type=int, default=4, help="validation scenes to average over")
    args = parser.parse_args()
    torch.manual_seed(0)
    print("| model | stage | kernel sum (mean, min-max) | std / bilinear's | mean / bilinear's | cosine to bilinear |")
    print("|---|---|---|---|---|---|")
    first = load_model(args.runs[0])
    images = torch.stack([prepare(first.recipe).data.val[i]["image"] for i in range(args.images)])
    untrained, channels = copy.deepcopy(first.model), first.model.backbone.channels
    untrained.upsampler = create_upsampler(
        "jbu",
        spatial_dims=2,
        in_channels=channels,
        out_channels=channels,
        scale=first.model.backbone.stride,
        guide_channels=3,
    )  # the default options, seeded above
    models = [("untrained", untrained)] + [(run, load_model(run).model) for run in args.runs]
    for name, model in models:
        if model.upsampler_name != "jbu":
            raise SystemExit(f"{name}: a run of {model.upsampler_name!r}, not jbu")
        for stage, (mean, low, high, std, avg, cosine) in enumerate(stage_rows(model.eval(), images), 1):
            print(f"| {name} | {stage} | {mean:.3f} ({low:.3f}-{high:.3f}) | {std:.3f} | {avg:.3f} | {cosine:.3f} |")


if __name__ == "__main__":
    main()
