"""The SR networks with shipped weights beside bicubic, on the held-out package photographs.

Each photograph (cropped to a multiple of the scale) is degraded as upzoo's SR training degrades —
MATLAB's bicubic by 1/scale, rounded to 8 bits — and upscaled whole by each network and by bicubic
interpolation (MATLAB's). PSNR and SSIM by BasicSR's conventions: outputs rounded to 8 bits, the Y
channel of ITU-R BT.601, ``scale`` pixels cropped at each border. Prints a markdown table (mean over
the photographs, and seconds per image on this machine) and writes a figure of crops: on the
degraded input (the table's task) and on the photograph itself, upscaled with no degradation (what
a user does; no reference exists there).

Real-ESRGAN's networks are trained for real-world degradations (blur, noise, JPEG), not for this
bicubic one, and trade fidelity for sharpness: a low PSNR here is their design, not a defect.

    python tools/sr_weights_table.py [--names realesrgan-x4plus,...] [--figure docs/img/sr_weights.png]
"""

from __future__ import annotations

import argparse
import time

import torch

from upzoo.data.bicubic import bicubic_downscale
from upzoo.data.package_images import PACKAGE_TEST, read_package_image
from upzoo.machine import machine_record
from upzoo.metrics.image_quality import psnr_ssim
from upzoo.models.sr_weights import load_sr_weights
from upzoo.train.super_resolution import bicubic_upscale

DEFAULT = ("realesrgan-x4plus", "realesrgan-x4plus-anime", "realesr-animevideov3-x4", "span-x4-ch48",
           "span-x4-ch52", "realesr-animevideov3-x2", "span-x2-ch48", "waifu2x-upconv7-photo-x2")  # fmt: skip


def photograph(name: str, scale: int) -> torch.Tensor:
    """``(1, 3, H, W)`` in [0, 1], cropped at the bottom and right to a multiple of ``scale``."""
    pixels = torch.from_numpy(read_package_image(name)).permute(2, 0, 1).float()[None] / 255
    h, w = (n - n % scale for n in pixels.shape[-2:])
    return pixels[..., :h, :w]


def eight_bit(images: torch.Tensor) -> torch.Tensor:
    return (images.clamp(0, 1) * 255).round() / 255


def scores(upscaler, scale: int) -> tuple[float, float, float]:
    """Mean PSNR, mean SSIM and seconds per image over the held-out photographs."""
    psnrs, ssims, seconds = [], [], []
    for name in PACKAGE_TEST:
        hr = photograph(name, scale)
        lr = eight_bit(bicubic_downscale(hr, scale))
        start = time.perf_counter()
        with torch.no_grad():
            out = eight_bit(upscaler(lr))
        seconds.append(time.perf_counter() - start)
        result = psnr_ssim(out, hr, crop_border=scale, y_channel=True)
        psnrs.append(float(result.psnr[0]))
        ssims.append(float(result.ssim[0]))
    return sum(psnrs) / len(psnrs), sum(ssims) / len(ssims), sum(seconds) / len(seconds)


def figure(networks: dict[str, torch.nn.Module], path: str) -> None:
    """Crops of ``chelsea`` at x4 or x2: degraded then upscaled (top), the photograph upscaled (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["bicubic", *networks]
    fig, axes = plt.subplots(2, len(names), figsize=(2.2 * len(names), 4.8), squeeze=False)
    for row, degrade in enumerate((True, False)):
        for col, name in enumerate(names):
            scale = 4 if name == "bicubic" else networks[name].scale
            hr = photograph("chelsea", 4)[..., 100:228, 100:228]
            lr = eight_bit(bicubic_downscale(hr, scale)) if degrade else hr[..., 40:72, 40:72]
            with torch.no_grad():
                out = bicubic_upscale(lr, scale) if name == "bicubic" else networks[name](lr)
            axes[row, col].imshow(eight_bit(out)[0].permute(1, 2, 0).numpy())
            axes[row, col].set_title(f"{name} x{scale}" if row == 0 else "", fontsize=7)
            axes[row, col].axis("off")
    axes[0, 0].text(-0.1, 0.5, "degraded by bicubic", rotation=90, transform=axes[0, 0].transAxes, va="center")
    axes[1, 0].text(-0.1, 0.5, "the photograph (32x32)", rotation=90, transform=axes[1, 0].transAxes, va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", default=",".join(DEFAULT), help="comma-separated weights names")
    parser.add_argument("--figure", default=None, help="PNG path for the crops")
    args = parser.parse_args()
    networks = {name: load_sr_weights(name) for name in args.names.split(",")}
    print(f"machine: {machine_record()['cpu']}; images: {', '.join(PACKAGE_TEST)} (mean over the five)\n")
    print("| network | scale | PSNR (Y) | SSIM (Y) | bicubic PSNR | bicubic SSIM | s / image |")
    print("|---|---|---|---|---|---|---|")
    baselines = {s: scores(lambda lr, s=s: bicubic_upscale(lr, s), s) for s in {n.scale for n in networks.values()}}
    for name, network in networks.items():
        psnr, ssim, seconds = scores(network, network.scale)
        base = baselines[network.scale]
        print(
            f"| {name} | x{network.scale} | {psnr:.2f} | {ssim:.4f} | {base[0]:.2f} | {base[1]:.4f} | {seconds:.2f} |"
        )
    if args.figure:
        figure({n: networks[n] for n in networks if networks[n].scale in (2, 4)}, args.figure)
        print(f"\nfigure: {args.figure}")


if __name__ == "__main__":
    main()
