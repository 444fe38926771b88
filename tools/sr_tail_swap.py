"""Swap the tail of a super-resolution network trained at scale: does its authors' tail win once
the body is fixed?

For each network with shipped weights, the body is frozen and its features are computed once
(training patches and the held-out photographs); then for each block a new tail
(:func:`upzoo.models.sr_weights.with_tail`, seeded) is trained alone on the cached features — L1 to
the high-resolution patch, Adam with a cosine schedule — and scored by PSNR on the Y channel
(BasicSR's conventions: 8-bit outputs, ``scale`` border pixels cropped) over the five held-out
package photographs. The authors' kind of tail is retrained the same way (the paired baseline);
the shipped, trained tail is printed beside it. Every new tail sees the body's features divided by
their RMS over the training patches (one fixed number per network): one rule for every network,
so that no block's initialisation meets another feature scale. SPAN's tail has no residual to lean
on (it writes the whole image), so the learning rate is 5e-3 (cosine): at 1e-3 its retrained tails
were still far from the shipped one after 300 steps.
Degradation: MATLAB bicubic, rounded to 8 bits (Real-ESRGAN's bodies were trained for real-world
degradations: a fixed body, a new task).

Every finished cell is appended to ``--out`` (JSON lines); a second run skips what is there.

    python tools/sr_tail_swap.py --out runs/sr-tail-swap.jsonl [--networks ...] [--steps 300] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from upzoo.bench.stats import paired_difference, seed_interval
from upzoo.data.bicubic import bicubic_downscale
from upzoo.data.package_images import PACKAGE_TEST, PACKAGE_TRAIN, read_package_image
from upzoo.machine import machine_record
from upzoo.metrics.image_quality import psnr
from upzoo.models.sr_weights import load_sr_weights, with_tail

#: network -> its authors' tail (block, options)
SHIPPED = {
    "realesr-animevideov3-x4": ("pixel_shuffle", None),
    "span-x4-ch48": ("pixel_shuffle", None),
    "waifu2x-upconv7-photo-x2": ("transposed", {"kernel_size": 4, "padding": 3}),
    "realesrgan-x4plus-anime": ("interp_conv", None),
}
BLOCKS = "pixel_shuffle,interp_conv,transposed,fir,dysample,carafe,interp_conv:mode=fourier"


class Scaled(torch.nn.Module):
    """``x * factor`` (fixed), then ``module``: a new tail fed unit-RMS features."""

    def __init__(self, module: torch.nn.Module, factor: float) -> None:
        super().__init__()
        self.module, self.factor = module, factor
        self.in_channels = getattr(module, "in_channels", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x * self.factor)


def _options(block: str, scale: int) -> tuple[str, dict | None]:
    name, _, rest = block.partition(":")
    options = dict(pair.split("=") for pair in rest.split(",")) if rest else None
    if name == "transposed" and scale == 2:
        options = {"kernel_size": 4, "padding": 1}  # DCGAN's x2 stage (kernel = scale at x4)
    return name, options


def _unit(name: str) -> torch.Tensor:
    return torch.from_numpy(read_package_image(name)).permute(2, 0, 1).float()[None] / 255


def _degrade(hr: torch.Tensor, scale: int) -> torch.Tensor:
    return (bicubic_downscale(hr, scale).clamp(0, 1) * 255).round() / 255


def training_patches(scale: int, count: int, lr_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` random (LR, HR) pairs from the training photographs, seeded: the same for every cell."""
    generator = torch.Generator().manual_seed(0)
    photos = [_unit(name) for name in PACKAGE_TRAIN]
    lrs, hrs = [], []
    side = lr_size * scale
    for i in range(count):
        photo = photos[i % len(photos)]
        top = int(torch.randint(0, photo.shape[-2] - side + 1, (1,), generator=generator))
        left = int(torch.randint(0, photo.shape[-1] - side + 1, (1,), generator=generator))
        hr = photo[..., top : top + side, left : left + side]
        hrs.append(hr)
        lrs.append(_degrade(hr, scale))
    return torch.cat(lrs), torch.cat(hrs)


def held_out(scale: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    pairs = []
    for name in PACKAGE_TEST:
        hr = _unit(name)
        hr = hr[..., : hr.shape[-2] - hr.shape[-2] % scale, : hr.shape[-1] - hr.shape[-1] % scale]
        pairs.append((_degrade(hr, scale), hr))
    return pairs


def score(network, cached: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], scale: int) -> float:
    """Mean PSNR (Y, 8-bit, border ``scale``) over the held-out photographs."""
    values = []
    with torch.no_grad():
        for features, lr, hr in cached:
            out = (network.reconstruct(features, lr).clamp(0, 1) * 255).round() / 255
            values.append(float(psnr(out, hr, crop_border=scale, y_channel=True)[0]))
    return sum(values) / len(values)


def train_tail(network, data, steps: int, batch: int, lr: float, seed: int) -> None:
    """Train ``network.tail`` alone on cached ``(features, LR, HR)`` patches."""
    features, lrs, hrs = data
    params = list(network.tail.parameters())
    optimizer = torch.optim.Adam(params, lr=lr) if params else None
    generator = torch.Generator().manual_seed(seed)
    network.train()
    for step in range(steps if params else 0):
        for group in optimizer.param_groups:
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        index = torch.randint(0, len(features), (batch,), generator=generator)
        loss = F.l1_loss(network.reconstruct(features[index], lrs[index]), hrs[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    network.eval()


def _done(out: Path) -> dict[tuple, float]:
    if not out.exists():
        return {}
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {(r["network"], r["tail"], r["seed"]): r["psnr_y"] for r in rows}


def run_network(name: str, args, done: dict) -> None:
    network = load_sr_weights(name).requires_grad_(False)
    scale = network.scale
    lrs, hrs = training_patches(scale, args.patches)
    with torch.no_grad():
        features = torch.cat([network.features(lrs[i : i + 16]) for i in range(0, len(lrs), 16)])
        cached = [(network.features(lr), lr, hr) for lr, hr in held_out(scale)]
    factor = float(1 / features.pow(2).mean().sqrt())
    print(f"{name}: features' RMS {1 / factor:.3g}, new tails see them divided by it", flush=True)
    shipped_block, shipped_options = SHIPPED[name]
    blocks = [b for b in args.blocks.split(",") if _options(b, scale) != (shipped_block, shipped_options)]
    cells = [("shipped (trained)", 0)] + [(b, s) for b in ("shipped", *blocks) for s in range(args.seeds)]
    for tail, seed in cells:
        if (name, tail, seed) in done:
            continue
        start = time.perf_counter()
        if tail == "shipped (trained)":
            model, params = network, sum(p.numel() for p in network.tail.parameters())
        else:
            block, options = (shipped_block, shipped_options) if tail == "shipped" else _options(tail, scale)
            torch.manual_seed(seed)
            model = with_tail(network, block, options)
            model.tail = Scaled(model.tail.requires_grad_(True), factor)
            params = sum(p.numel() for p in model.tail.parameters())
            train_tail(model, (features, lrs, hrs), args.steps, args.batch, args.lr, seed)
        seconds = round(time.perf_counter() - start, 1)
        row = {"network": name, "tail": tail, "seed": seed, "psnr_y": score(model, cached, scale),
               "tail_params": params, "seconds": seconds, "steps": args.steps}  # fmt: skip
        with args.out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(f"{name} {tail} seed {seed}: {row['psnr_y']:.3f} dB in {row['seconds']} s", flush=True)


def report(out: Path) -> None:
    """The table per network: each tail's mean ± sd over seeds and its paired difference to the
    authors' kind of tail retrained."""
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    for name in dict.fromkeys(r["network"] for r in rows):
        mine = [r for r in rows if r["network"] == name]
        by_tail: dict[str, dict[int, float]] = {}
        for r in mine:
            by_tail.setdefault(r["tail"], {})[r["seed"]] = r["psnr_y"]
        params = {r["tail"]: r["tail_params"] for r in mine}
        base = by_tail.get("shipped", {})
        print(f"\n{name} (tail: {SHIPPED[name][0]}; steps {mine[-1]['steps']})\n")
        print("| tail | seeds | PSNR Y dB | Δ vs the authors' tail retrained | tail params |")
        print("|---|---|---|---|---|")
        for tail, values in by_tail.items():
            seeds = sorted(values)
            stats = seed_interval([values[s] for s in seeds])
            spread = f" ± {stats['std']:.3f}" if len(seeds) > 1 else ""
            delta = "(baseline)" if tail == "shipped" else "—"
            if tail not in ("shipped", "shipped (trained)") and set(seeds) <= set(base):
                d = paired_difference([values[s] for s in seeds], [base[s] for s in seeds])
                delta = f"{d['diff']:+.3f} [{d['diff_low']:+.3f}, {d['diff_high']:+.3f}]" + (
                    " **beyond noise**" if d["beyond"] else ""
                )
            print(f"| {tail} | {len(seeds)} | {stats['mean']:.3f}{spread} | {delta} | {params[tail]} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines file of finished cells")
    parser.add_argument("--networks", default="realesr-animevideov3-x4,span-x4-ch48,waifu2x-upconv7-photo-x2")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--blocks", default=BLOCKS, help="comma-separated blocks (block:key=value,...)")
    parser.add_argument("--patches", type=int, default=384)
    parser.add_argument("--report", action="store_true", help="only print the tables of --out")
    args = parser.parse_args()
    if not args.report:
        print(f"machine: {machine_record()['cpu']}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        done = _done(args.out)
        for name in args.networks.split(","):
            run_network(name, args, done)
    report(args.out)


if __name__ == "__main__":
    main()
