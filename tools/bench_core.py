"""Core benchmarks (issue: registry and blocks).

1. Every block's forward+backward time against the same computation written directly with torch.nn
   layers, side by side (ratio = upzoo / direct; 1.00 means no overhead).
2. masked_gaussian_blur forward+backward against the per-pixel loop it replaces (timed on a small
   input and scaled per pixel), kornia's gaussian_blur2d + torch.where and torchvision's
   gaussian_blur + torch.where, and its achieved bytes/s against this machine's memory-copy bandwidth;
   both implementations behind it: the fused CPU kernel (the default where it was built) and the
   PyTorch formulation (what runs on the GPU and for the cases the kernel does not take).

    python tools/bench_core.py [--runs 15] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import platform

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import torch
import torch.nn.functional as F
from torch import nn

import upzoo.filters.masked_blur as masked_blur_module
from upzoo import create_upsampler, masked_gaussian_blur
from upzoo.bench.speed import compare_calls, memcpy_bandwidth, time_call


class DirectDySample(nn.Module):
    """DySample ('lp', static scope 0.25) written directly, as in the authors' reference code."""

    def __init__(self, channels: int, scale: int, groups: int) -> None:
        super().__init__()
        self.scale, self.groups = scale, groups
        self.offset = nn.Conv2d(channels, 2 * groups * scale * scale, 1)
        h = (torch.arange(scale) - (scale - 1) / 2) / scale
        init = (
            torch.stack(torch.meshgrid(h, h, indexing="ij")).transpose(1, 2).repeat(1, groups, 1).reshape(1, -1, 1, 1)
        )
        self.register_buffer("init_pos", init)

    def forward(self, x):
        b, _, h, w = x.shape
        offset = (self.offset(x) * 0.25 + self.init_pos).view(b, 2, -1, h, w)
        coords_w = torch.arange(w, device=x.device) + 0.5
        coords_h = torch.arange(h, device=x.device) + 0.5
        coords = torch.stack(torch.meshgrid(coords_w, coords_h, indexing="ij")).transpose(1, 2)
        coords = coords.unsqueeze(1).unsqueeze(0).type(x.dtype)
        normalizer = torch.tensor([w, h], dtype=x.dtype, device=x.device).view(1, 2, 1, 1, 1)
        coords = 2 * (coords + offset) / normalizer - 1
        coords = F.pixel_shuffle(coords.view(b, -1, h, w), self.scale).view(b, 2, -1, self.scale * h, self.scale * w)
        coords = coords.permute(0, 2, 3, 4, 1).contiguous().flatten(0, 1)
        return F.grid_sample(
            x.reshape(b * self.groups, -1, h, w), coords, mode="bilinear", align_corners=False, padding_mode="border"
        ).view(b, -1, self.scale * h, self.scale * w)


class DirectCarafe(nn.Module):
    """CARAFE written directly the common way: kernels shuffled to full resolution, unfold upsampled."""

    def __init__(self, channels: int, scale: int, k_up: int = 5, k_enc: int = 3, mid: int = 64) -> None:
        super().__init__()
        self.scale, self.k_up = scale, k_up
        self.compress = nn.Conv2d(channels, mid, 1)
        self.encoder = nn.Conv2d(mid, k_up * k_up * scale * scale, k_enc, padding=k_enc // 2)

    def forward(self, x):
        b, c, h, w = x.shape
        kernels = F.pixel_shuffle(self.encoder(self.compress(x)), self.scale).softmax(dim=1)  # (B, k2, sH, sW)
        patches = F.unfold(x, self.k_up, padding=self.k_up // 2).view(b, c * self.k_up**2, h, w)
        patches = F.interpolate(patches, scale_factor=self.scale, mode="nearest")
        patches = patches.view(b, c, self.k_up**2, h * self.scale, w * self.scale)
        return (patches * kernels.unsqueeze(1)).sum(dim=2)


def direct_reference(name: str, dims: int, c: int, scale: tuple[int, ...]) -> nn.Module:
    conv = nn.Conv2d if dims == 2 else nn.Conv3d
    if name == "transposed":
        return (nn.ConvTranspose2d if dims == 2 else nn.ConvTranspose3d)(c, c, scale, stride=scale)
    if name == "pixel_shuffle":
        if dims == 2:
            return nn.Sequential(conv(c, c * scale[0] * scale[1], 3, padding=1), nn.PixelShuffle(scale[0]))

        class Shuffle3d(nn.Module):
            def forward(self, x):
                b, ch, d, h, w = x.shape
                r1, r2, r3 = scale
                x = x.view(b, ch // (r1 * r2 * r3), r1, r2, r3, d, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
                return x.reshape(b, -1, d * r1, h * r2, w * r3)

        return nn.Sequential(conv(c, c * scale[0] * scale[1] * scale[2], 3, padding=1), Shuffle3d())
    if name == "interp_conv":
        return nn.Sequential(nn.Upsample(scale_factor=scale, mode="nearest"), conv(c, c, 3, padding=1))
    if name == "interpolate":
        return nn.Upsample(scale_factor=scale, mode="nearest")
    if name == "dysample":
        return DirectDySample(c, scale[0], groups=4)
    if name == "carafe":
        return DirectCarafe(c, scale[0])
    raise KeyError(name)


def bench_blocks(runs: int) -> None:
    print("## Blocks: forward+backward, upzoo vs the same layers written directly\n")
    print("| block | input | upzoo ms | direct ms | ratio |")
    print("|---|---|---|---|---|")
    cases = [(2, (8, 64, 64, 64), (2, 2)), (3, (2, 32, 16, 48, 48), (1, 2, 2))]
    for name in ["transposed", "pixel_shuffle", "interp_conv", "interpolate", "dysample", "carafe"]:
        for dims, shape, scale in cases:
            if name in ("dysample", "carafe") and dims == 3:
                continue
            c = shape[1]
            ours = create_upsampler(name, spatial_dims=dims, in_channels=c, out_channels=c, scale=scale)
            ref = direct_reference(name, dims, c, scale)
            x = torch.randn(*shape, requires_grad=True)

            def step(module):
                def run():
                    y = module(x)
                    y.backward(torch.ones_like(y))

                return run

            t = compare_calls({"ours": step(ours), "ref": step(ref)}, warmup=3, runs=runs)
            print(
                f"| {name} | {'x'.join(map(str, shape))} s={'x'.join(map(str, scale))} | "
                f"{t['ours'].median * 1e3:.2f} | {t['ref'].median * 1e3:.2f} | "
                f"{t['ours'].median / t['ref'].median:.3f} |"
            )


def loop_blur(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """The per-pixel loop of the original question, with autograd through every assignment."""
    kernel = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]) / 16
    out = x.clone()
    b, c, h, w = x.shape
    for n in range(b):
        for ch in range(c):
            for i in range(1, h - 1):
                for j in range(1, w - 1):
                    if x[n, ch, i, j] >= threshold:
                        out[n, ch, i, j] = (x[n, ch, i - 1 : i + 2, j - 1 : j + 2] * kernel).sum()
    return out


def bench_masked_blur(runs: int) -> None:
    import kornia
    import torchvision.transforms.functional as TF

    bandwidth = memcpy_bandwidth()
    print(f"\n## Masked blur, forward+backward (memory-copy bandwidth here: {bandwidth / 1e9:.2f} GB/s)\n")
    per_pixel = {}
    for size in (16, 64):  # its cost per pixel grows with the image (autograd's CopySlices chain)
        small = torch.randn(1, 3, size, size, requires_grad=True)
        timing = time_call(lambda: loop_blur(small, 0.5).backward(torch.ones_like(small)), warmup=1, runs=3)
        per_pixel[size] = timing.median / small.numel()
        print(f"per-pixel loop on 1x3x{size}x{size}: {per_pixel[size] * 1e6:.1f} us per pixel")
    fused_label = "fused kernel" if masked_blur_module.FUSED_CPU_KERNEL else "fused kernel NOT BUILT: PyTorch"
    sigma = 0.8  # close to the [1,2,1]/4 taps; the cost does not depend on the value
    loop_rows, peer_rows = [], []
    for shape in [(64, 3, 64, 64), (16, 3, 256, 256)]:
        x = torch.randn(*shape, requires_grad=True)
        g = torch.ones(shape)

        def ours():
            masked_gaussian_blur(x, threshold=0.5).backward(g)

        def ours_pytorch():
            with masked_blur_module.pytorch_formulation():
                ours()

        def with_kornia():
            torch.where(x >= 0.5, kornia.filters.gaussian_blur2d(x, (3, 3), (sigma, sigma)), x).backward(g)

        def with_torchvision():
            torch.where(x >= 0.5, TF.gaussian_blur(x, [3, 3], [sigma, sigma]), x).backward(g)

        # against the loop, both timed alone (the loop above was); against the peers, interleaved.
        # Ten warm-up calls: the first few after the loop still fault in fresh pages for the allocator.
        alone = time_call(ours, warmup=10, runs=runs).median
        alone_pytorch = time_call(ours_pytorch, warmup=10, runs=runs).median
        t = compare_calls(
            {"ours": ours, "pytorch": ours_pytorch, "kornia": with_kornia, "tv": with_torchvision}, warmup=10, runs=runs
        )
        loops = [per_pixel[size] * x.numel() for size in (16, 64)]
        traffic = 5 * x.numel() * x.element_size()  # forward reads x, writes out; backward reads g and x, writes grad
        name = "x".join(map(str, shape))
        for label, seconds in ((fused_label, alone), ("PyTorch formulation", alone_pytorch)):
            loop_rows.append(
                f"| {name} | {label} | {seconds * 1e3:.2f} | "
                f"{loops[0] * 1e3:,.0f} / {loops[1] * 1e3:,.0f} | "
                f"{loops[0] / seconds:,.0f}x / {loops[1] / seconds:,.0f}x | "
                f"{traffic / seconds / bandwidth:.0%} |"
            )
        best = min(t["kornia"].median, t["tv"].median)
        peer_rows.append(
            f"| {name} | {t['ours'].median * 1e3:.2f} | {t['pytorch'].median * 1e3:.2f} | "
            f"{t['kornia'].median * 1e3:.2f} | {t['tv'].median * 1e3:.2f} | "
            f"{best / t['ours'].median:.1f}x / {best / t['pytorch'].median:.1f}x |"
        )
    print(
        "\n| input | implementation | upzoo ms (alone) | loop ms (scaled from 16x16 / 64x64) | "
        "speed-up vs loop (16x16 / 64x64 basis) | bytes/s vs memcpy |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(loop_rows))
    print(
        f"\n| input | upzoo ms ({fused_label}) | upzoo ms (PyTorch formulation) | kornia ms | torchvision ms | "
        "faster than the faster of the two |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(peer_rows))
    if masked_blur_module.FUSED_CPU_KERNEL:
        bench_blur_geometries(runs)


def bench_blur_geometries(runs: int) -> None:
    """The fused kernel against the PyTorch formulation beyond the 3x3 2D case, interleaved."""
    cases = [
        ((64, 3, 64, 64), dict(stride=2)),
        ((64, 3, 64, 64), dict(kernel_size=7)),
        ((64, 3, 64, 64), dict(border="reflect")),
        ((64, 3, 64, 64), dict(dtype=torch.float64)),
        ((2, 1, 48, 128, 128), dict(kernel_size=3)),
        ((2, 1, 48, 128, 128), dict(kernel_size=5, border="replicate")),
    ]
    print("\n| input | options | fused kernel ms | PyTorch formulation ms | ratio |")
    print("|---|---|---|---|---|")
    for shape, options in cases:
        options = dict(options)
        dtype = options.pop("dtype", torch.float32)
        x = torch.randn(*shape, dtype=dtype, requires_grad=True)
        g = torch.ones(shape, dtype=dtype)

        def fused():
            masked_gaussian_blur(x, threshold=0.5, **options).backward(g)

        def pytorch():
            with masked_blur_module.pytorch_formulation():
                fused()

        t = compare_calls({"fused": fused, "pytorch": pytorch}, warmup=10, runs=runs)
        label = ", ".join(
            [f"{k}={v}" for k, v in options.items()]
            + ([str(dtype).replace("torch.", "")] if dtype != torch.float32 else [])
        )
        print(
            f"| {'x'.join(map(str, shape))} | {label} | {t['fused'].median * 1e3:.2f} | "
            f"{t['pytorch'].median * 1e3:.2f} | {t['pytorch'].median / t['fused'].median:.1f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15, help="timed runs per case")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--only", choices=["blocks", "blur"], default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} threads, "
        f"median of {args.runs} interleaved runs\n"
    )
    if args.only in (None, "blocks"):
        bench_blocks(args.runs)
    if args.only in (None, "blur"):
        bench_masked_blur(args.runs)


if __name__ == "__main__":
    main()
