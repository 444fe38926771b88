"""Model benchmarks (issue: models).

1. U-Net training step with a resnet18 encoder vs smp.Unet("resnet18") on 2x3x256x512, side by side:
   upzoo's UNet with `interpolate` (nearest, smp's own upsampling) and with `interp_conv`.
2. DCGAN 64x64, batch 64: a full GAN training step (D then G) with the masked-blur post-filter vs
   without.
3. Peak memory of a U-Net training step with and without gradient checkpointing.

    python tools/bench_models.py [--runs 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import platform

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import segmentation_models_pytorch as smp
import torch
import torch.nn.functional as F

import upzoo.filters.masked_blur as masked_blur_module
from upzoo.bench.memory import peak_memory
from upzoo.bench.speed import compare_calls
from upzoo.models import DCGANDiscriminator, DCGANGenerator, UNet


def seg_step(model, x, y, opt):
    def run():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return run


def bench_unet(runs: int) -> None:
    print("## U-Net training step, resnet18 encoder, 2x3x256x512, 19 classes\n")
    x = torch.randn(2, 3, 256, 512)
    y = torch.randint(0, 19, (2, 256, 512))
    models = {
        "smp.Unet": smp.Unet("resnet18", encoder_weights=None, classes=19),
        "upzoo interpolate": UNet(
            spatial_dims=2, in_channels=3, num_classes=19, encoder="resnet18", upsampler="interpolate"
        ),
        "upzoo interp_conv": UNet(
            spatial_dims=2, in_channels=3, num_classes=19, encoder="resnet18", upsampler="interp_conv"
        ),
    }
    steps = {n: seg_step(m, x, y, torch.optim.SGD(m.parameters(), lr=0.01)) for n, m in models.items()}
    t = compare_calls(steps, warmup=2, runs=runs)
    ref = t["smp.Unet"].median
    print("| model | params | step s | ratio vs smp.Unet |")
    print("|---|---|---|---|")
    for name, model in models.items():
        params = sum(p.numel() for p in model.parameters())
        print(f"| {name} | {params / 1e6:.2f} M | {t[name].median:.3f} | {t[name].median / ref:.3f} |")


def bench_dcgan(runs: int) -> None:
    print("\n## DCGAN 64x64, batch 64: one D step + one G step, masked-blur post-filter vs none\n")
    real = torch.rand(64, 3, 64, 64) * 2 - 1

    def gan_step(post_filter):
        torch.manual_seed(0)
        g = DCGANGenerator.classic(
            100, 3, 64, post_filter=post_filter, post_filter_options={"threshold": 0.5} if post_filter else None
        )
        d = DCGANDiscriminator(in_channels=3, resolution=64)
        og, od = torch.optim.Adam(g.parameters(), 2e-4), torch.optim.Adam(d.parameters(), 2e-4)
        ones, zeros = torch.ones(64), torch.zeros(64)

        def run():
            z = torch.randn(64, 100)
            fake = g(z)
            od.zero_grad(set_to_none=True)
            loss_d = F.binary_cross_entropy_with_logits(d(real), ones) + F.binary_cross_entropy_with_logits(
                d(fake.detach()), zeros
            )
            loss_d.backward()
            od.step()
            og.zero_grad(set_to_none=True)
            F.binary_cross_entropy_with_logits(d(fake), ones).backward()
            og.step()

        return run

    def pytorch_formulation(step):
        def run():
            with masked_blur_module.pytorch_formulation():
                step()

        return run

    fused = "masked_blur (fused kernel)" if masked_blur_module.FUSED_CPU_KERNEL else "masked_blur (kernel not built)"
    steps = {
        "none": gan_step(None),
        fused: gan_step("masked_blur"),
        "masked_blur (PyTorch formulation)": pytorch_formulation(gan_step("masked_blur")),
    }
    t = compare_calls(steps, warmup=2, runs=runs)
    print("| post-filter | step s | ratio |")
    print("|---|---|---|")
    for name in steps:
        print(f"| {name} | {t[name].median:.3f} | {t[name].median / t['none'].median:.3f} |")


def bench_checkpointing() -> None:
    print("\n## Peak memory of a U-Net training step, with and without gradient checkpointing\n")
    print("| model | input | checkpointing | peak MiB | method |")
    print("|---|---|---|---|---|")
    cases = [
        (
            "2D resnet18 U-Net",
            dict(spatial_dims=2, in_channels=3, num_classes=19, encoder="resnet18"),
            (2, 3, 256, 512),
        ),
        (
            "3D plain U-Net (1,2,2)-first",
            dict(
                spatial_dims=3,
                in_channels=1,
                num_classes=4,
                channels=(16, 32, 64, 128),
                strides=[(1, 2, 2), (1, 2, 2), (2, 2, 2)],
            ),
            (1, 1, 32, 128, 128),
        ),
    ]
    for label, kwargs, shape in cases:
        peaks = {}
        for ckpt in (False, True):
            model = UNet(checkpointing=ckpt, **kwargs)
            x = torch.randn(*shape)
            y = torch.randint(0, kwargs["num_classes"], (shape[0], *shape[2:]))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            step = seg_step(model, x, y, opt)
            step()  # allocate optimiser state and gradients first
            peaks[ckpt] = peak_memory(step)
            print(f"| {label} | {'x'.join(map(str, shape))} | {ckpt} | {peaks[ckpt].mib:.0f} | {peaks[ckpt].method} |")
        print(f"| {label} | | saving | {1 - peaks[True].bytes / peaks[False].bytes:.0%} | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--only", choices=["unet", "dcgan", "memory"], default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"torch {torch.__version__}, {platform.machine()}, {args.threads} threads, "
        f"median of {args.runs} interleaved runs\n"
    )
    if args.only in (None, "unet"):
        bench_unet(args.runs)
    if args.only in (None, "dcgan"):
        bench_dcgan(args.runs)
    if args.only in (None, "memory"):
        bench_checkpointing()


if __name__ == "__main__":
    main()
