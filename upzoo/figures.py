"""PNG outputs of a run: loss and metric curves, prediction grids, GAN sample grids and spectra."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["plot_curves", "prediction_grid", "sample_grid", "titled_grid", "class_palette", "spectrum_plot"]


def class_palette(num_classes: int, palette: np.ndarray | None = None) -> np.ndarray:
    """``(num_classes + 1, 3)`` uint8 colours (the last for ignored pixels): ``palette`` or a fixed set."""
    if palette is not None and len(palette) >= num_classes:
        return np.concatenate([palette[:num_classes], [[0, 0, 0]]]).astype(np.uint8)
    rng = np.random.default_rng(7)
    colors = rng.integers(40, 255, (num_classes, 3))
    colors[0] = (0, 0, 0)
    return np.concatenate([colors, [[255, 255, 255]]]).astype(np.uint8)


def _colorize(labels: torch.Tensor, palette: np.ndarray) -> np.ndarray:
    index = labels.numpy().astype(np.int64)
    index = np.where((index < 0) | (index >= len(palette) - 1), len(palette) - 1, index)
    return palette[index]


def _display(image: torch.Tensor, mean: Sequence[float] | None, std: Sequence[float] | None) -> np.ndarray:
    x = image.float()
    if mean is not None and std is not None and x.shape[0] == len(mean):
        x = x * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]
    else:
        x = (x - x.min()) / (x.max() - x.min()).clamp_min(1e-6)
    if x.shape[0] == 1:
        x = x.repeat(3, 1, 1)
    return (x[:3].clamp(0, 1).permute(1, 2, 0).numpy() * 255).astype(np.uint8)


def prediction_grid(
    examples: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    path: str | Path,
    *,
    palette: np.ndarray,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    class_names: Sequence[str] | None = None,
) -> None:
    """One row per example under the titles image | ground truth | prediction (3D: the middle slice
    of axis 0), and a key of the classes shown (their colours and ``class_names``; ignored pixels take
    the palette's last colour and have no key)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not examples:
        return
    tiles, shown = [], set()
    for image, mask, pred in examples:
        if image.ndim == 4:  # (C, D, H, W) volume: middle slice
            d = image.shape[1] // 2
            image, mask, pred = image[:, d], mask[d], pred[d]
        tiles.append([_display(image, mean, std), _colorize(mask, palette), _colorize(pred, palette)])
        shown |= {int(v) for v in torch.cat([mask.flatten(), pred.flatten()]).unique() if 0 <= v < len(palette) - 1}
    height, width = tiles[0][0].shape[:2]
    side = 2.6 * width / max(height, width) + 0.4
    fig, axes = plt.subplots(len(tiles), 3, figsize=(3 * side, len(tiles) * side * height / width + 1.6), squeeze=False)
    for i, row in enumerate(tiles):
        for j, (tile, title) in enumerate(zip(row, ("image", "ground truth", "prediction"))):
            axes[i][j].imshow(tile, interpolation="nearest")
            axes[i][j].set_xticks([]), axes[i][j].set_yticks([])
            if i == 0:
                axes[i][j].set_title(title, fontsize=9)
    names = list(class_names or [str(k) for k in range(len(palette) - 1)])
    handles = [Patch(facecolor=palette[k] / 255, edgecolor="grey", label=names[k] if k < len(names) else str(k))
               for k in sorted(shown)]  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=min(6, max(1, len(handles))), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * math.ceil(len(handles) / 6), 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_curves(
    rows: list[dict[str, str]], path: str | Path, metrics: Sequence[str],
    baselines: dict[str, tuple[str, float] | list[tuple[str, float]]] | None = None,
) -> None:  # fmt: skip
    """Training loss and each validation metric against the step, every metric in a panel of its
    own (a generator's SWD in the hundreds, spectral error in tens and checkerboard in tenths each
    keep a readable scale); ``baselines`` draws a labelled reference line (or two: a list) in a
    metric's panel (bicubic's PSNR beside the network's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key):
        pts = [(int(r["step"]), float(r[key])) for r in rows if r.get(key) not in (None, "", "nan")]
        return zip(*pts) if pts else ((), ())

    loss_keys = [k for k in ("loss", "loss_d", "loss_g") if any(r.get(k) not in (None, "", "nan") for r in rows)]
    metrics = [m for m in metrics if m not in ("loss", "loss_d", "loss_g")]  # the losses have their own panel
    fig, axes = plt.subplots(1, 1 + len(metrics), figsize=(4.2 * (1 + len(metrics)), 3.6), squeeze=False)
    axes = axes[0]
    for key in loss_keys:
        steps, values = series(key)
        axes[0].plot(steps, values, label=key, marker="o" if len(steps) < 3 else None)  # one point shows too
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("loss")
    axes[0].set_title("training loss")
    if loss_keys:
        axes[0].legend()
    for axis, key in zip(axes[1:], metrics):
        steps, values = series(key)
        axis.plot(steps, values, marker="o", label="this run")
        references = (baselines or {}).get(key, [])
        for (label, value), style in zip([references] if isinstance(references, tuple) else references, ("--", ":")):
            axis.axhline(value, color="grey", linestyle=style, label=f"{label} ({value:.4g})")
        if references:
            axis.legend(fontsize=8)
        axis.set_xlabel("step")
        axis.set_ylabel(curve_label(key))
        axis.set_title(f"{curve_label(key)} (validation)" if key.startswith("val_") else curve_label(key))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: How a metrics.csv column reads in a figure (the others: the name without ``val_``, spaces for ``_``).
CURVE_LABELS = {
    "miou": "mIoU", "psnr_y": "PSNR Y (dB)", "psnr": "PSNR (dB)", "ssim_y": "SSIM Y", "ssim": "SSIM",
    "psnr_rgb": "PSNR RGB (dB)", "swd": "SWD", "kid": "KID", "fd": "FD", "dice": "mean Dice",
    "gm_dice": "grey-matter Dice", "csf_dice": "CSF/other Dice", "wm_dice": "white-matter Dice",
    "hd95": "HD95 (mm)", "gm_hd95": "grey-matter HD95 (mm)",
    "boundary_iou": "Boundary IoU", "boundary_fscore": "boundary F", "cosine": "cosine to the full features",
    "pixel_accuracy": "pixel accuracy", "mean_dice": "mean Dice",
}  # fmt: skip


def curve_label(key: str) -> str:
    """``val_psnr_y`` -> ``PSNR Y (dB)``: a metrics.csv column as a person reads it."""
    name = key.removeprefix("val_")
    return CURVE_LABELS.get(name, name.replace("_", " "))


def titled_grid(
    rows: Sequence[Sequence[tuple[torch.Tensor, str]]], columns: Sequence[str], path: str | Path, title: str = ""
) -> None:
    """Tiles ``(C, H, W)`` in [0, 1], one row per example, a title over each column and a caption
    under each tile, as one PNG (what a reader would otherwise have to look up)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), len(columns), figsize=(2.4 * len(columns), 2.5 * len(rows) + 0.5),
                             squeeze=False)  # fmt: skip
    for i, row in enumerate(rows):
        for j, (tile, caption) in enumerate(row):
            axis = axes[i][j]
            axis.imshow(tile.float().clamp(0, 1).expand(3, -1, -1).permute(1, 2, 0).numpy(), interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            axis.set_xlabel(caption, fontsize=8)
            if i == 0:
                axis.set_title(columns[j], fontsize=9)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def sample_grid(images: torch.Tensor, path: str | Path, nrow: int = 8, format: str | None = None) -> None:
    """Generated images in [-1, 1] as one PNG grid."""
    from torchvision.utils import save_image

    save_image(images.float() * 0.5 + 0.5, str(path), nrow=nrow, padding=2, format=format)


def spectrum_plot(real: np.ndarray, generated: dict[str, np.ndarray], path: str | Path, title: str = "") -> None:
    """Azimuthally averaged power spectra (log power over the radial frequency, Nyquist = 1) of the
    real images and of one or more generated sets, and each set's spectral error ``S_gen / S_real - 1``
    on a symmetric log axis (linear within ±0.05, logarithmic beyond, the sign kept): the band up to
    Nyquist, where errors are tenths, stays readable beside the corner rings beyond it (shaded),
    where a checkerboard's error can reach hundreds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from upzoo.metrics.spectrum import ring_frequencies

    frequency = 2 * ring_frequencies(real)  # 1 = Nyquist
    columns = 1 if max(map(len, generated), default=0) > 40 else 2  # long variant labels: one per row
    rows = -(-(len(generated) + 1) // columns)  # the legend below both panels, outside them
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8 + 0.22 * rows))
    axes[0].semilogy(frequency[1:], real[1:], color="black", linewidth=2, label="real")
    for name, spectrum in generated.items():
        axes[0].semilogy(frequency[1:], spectrum[1:], label=name)
        axes[1].plot(frequency[1:], spectrum[1:] / np.maximum(real[1:], 1e-30) - 1, label=name)
    axes[1].axhline(0, color="black", linewidth=1)
    axes[1].set_yscale("symlog", linthresh=0.05)
    low, high = axes[1].get_ylim()
    ticks = [t for t in (-1000, -100, -10, -1, -0.1, 0, 0.1, 1, 10, 100, 1000) if low <= t <= high]
    axes[1].set_yticks(ticks, [f"{t:g}" for t in ticks])
    axes[1].axvspan(1.0, frequency[-1], color="grey", alpha=0.12, linewidth=0)  # the corners, summarised apart
    for axis in axes:
        axis.axvline(0.5, color="grey", linestyle=":", linewidth=1)  # the spectral error summarises f > 0.5
        axis.axvline(1.0, color="grey", linestyle="--", linewidth=1)
        axis.set_xlabel("radial frequency (1 = Nyquist; beyond: the corners)")
    axes[0].set_title("power spectrum")
    axes[1].set_title("spectral error  S_gen / S_real − 1  (symmetric log)")
    if title:
        fig.suptitle(title)
    legend = 0.22 * rows / fig.get_figheight()  # the figure's fraction the legend takes
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=columns, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend + 0.02, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def super_resolution_grid(examples: Sequence[tuple[torch.Tensor, ...]], path: str | Path, side: int = 128) -> None:
    """One row per example: the low-resolution input (nearest-upscaled), bicubic, the network and
    the high-resolution reference, each the central ``side``-pixel square, titled, with the PSNR
    (RGB) of each crop against the reference."""

    def crop_psnr(image: torch.Tensor, reference: torch.Tensor) -> str:
        mse = float((image.float().clamp(0, 1) - reference.float()).square().mean())
        return f"PSNR {10 * math.log10(1 / mse):.2f} dB" if mse > 0 else "PSNR inf"

    rows, scale = [], 1
    for low, bicubic, output, target in examples:
        scale = target.shape[-1] // low.shape[-1]
        low = low.repeat_interleave(scale, -2).repeat_interleave(scale, -1)
        size = min(side, *target.shape[-2:])
        top, left = (target.shape[-2] - size) // 2, (target.shape[-1] - size) // 2
        low, bicubic, output, target = (
            t[..., top : top + size, left : left + size] for t in (low, bicubic, output, target)
        )
        rows.append([(low, crop_psnr(low, target)), (bicubic, crop_psnr(bicubic, target)),
                     (output, crop_psnr(output, target)), (target, "")])  # fmt: skip
    columns = [f"input (nearest x{scale})", "bicubic", "network", "reference (HR)"]
    titled_grid(rows, columns, path, title=f"central {side} px of each held-out image; PSNR of the crop, RGB")


def feature_pca(features: Sequence[torch.Tensor], basis_from: torch.Tensor) -> list[torch.Tensor]:
    """Feature maps ``(C, H_i, W_i)`` shown as RGB: projected on the three principal components of
    ``basis_from (C, H, W)``'s vectors, each component scaled to [0, 1] by its 1st-99th percentile
    over ``basis_from`` (the same colours mean the same features in every map)."""
    vectors = basis_from.flatten(1).T.double()
    centre = vectors.mean(0)
    _, _, v = torch.linalg.svd(vectors - centre, full_matrices=False)
    axes = v[:3].T  # (C, 3)
    reference = (vectors - centre) @ axes
    low, high = torch.quantile(reference, 0.01, dim=0), torch.quantile(reference, 0.99, dim=0)
    shown = []
    for f in features:
        rgb = (f.flatten(1).T.double() - centre) @ axes
        rgb = ((rgb - low) / (high - low).clamp_min(1e-12)).clamp(0, 1)
        shown.append(rgb.T.reshape(3, *f.shape[-2:]).float())
    return shown


@torch.no_grad()
def feature_grid(
    model: torch.nn.Module, images: Sequence[torch.Tensor], path: str | Path, *, device: Any = "cpu"
) -> None:
    """One row per image of a feature upsampler: the image, its backbone features (nearest), bilinear
    upsampling of them and the model's upsampling to pixels, in the same principal-component colours
    (the images cropped to a common size, a multiple of the stride)."""

    stride = model.backbone.stride
    h, w = (min(image.shape[axis] for image in images) // stride * stride for axis in (-2, -1))
    rows = []
    for image in images:
        image = image[..., :h, :w][None].to(device)
        low = model.backbone(image)
        bilinear = torch.nn.functional.interpolate(low, size=(h, w), mode="bilinear", align_corners=False)
        lifted = model(image)
        nearest = low.repeat_interleave(stride, -2).repeat_interleave(stride, -1)
        shown = feature_pca([nearest[0].cpu(), bilinear[0].cpu(), lifted[0].float().cpu()], low[0].cpu())
        rows.append([(image[0].cpu(), f"{h}x{w}"), (shown[0], f"{h // stride}x{w // stride}"), (shown[1], ""),
                     (shown[2], "")])  # fmt: skip
    columns = ["image", "backbone features (nearest)", "bilinear", getattr(model, "upsampler_name", "the block")]
    titled_grid(rows, columns, path, title="features in the same principal-component colours")


def spectrum_evolution_plot(
    real: np.ndarray, generated: dict[int, np.ndarray], path: str | Path, title: str = ""
) -> None:
    """The real images' power spectrum (black) and the generated images' at each evaluation step
    (``{step: spectrum}``, coloured from early to late), log power over the radial frequency in
    cycles per pixel (0.5: Nyquist; beyond it, shaded: the corners)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from upzoo.metrics.spectrum import ring_frequencies

    frequency = ring_frequencies(real)
    fig, axis = plt.subplots(figsize=(6.4, 4))
    steps = sorted(generated)
    colours = plt.cm.viridis(np.linspace(0, 1, len(steps)))
    for step, colour in zip(steps, colours):
        axis.semilogy(frequency[1:], generated[step][1:], color=colour, linewidth=1)
    axis.semilogy(frequency[1:], real[1:], color="black", linewidth=2, label="real")
    mappable = plt.cm.ScalarMappable(cmap="viridis", norm=plt.Normalize(steps[0], steps[-1]))
    fig.colorbar(mappable, ax=axis, label="training step")
    axis.axvspan(0.5, frequency[-1], color="grey", alpha=0.12, linewidth=0)
    axis.set_xlabel("radial frequency (cycles per pixel; 0.5 = Nyquist, beyond: the corners)")
    axis.set_ylabel("power")
    axis.legend(fontsize=8)
    axis.set_title(title or "power spectrum over training")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def spectral_error_evolution_plot(errors: dict[int, np.ndarray], path: str | Path, title: str = "") -> None:
    """The spectral error ``S_gen / S_real - 1`` per ring (x, cycles per pixel) at each evaluation
    step (y), clipped to ±1 (blue: too little power, red: too much), as Schwarz et al. plot it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(errors)
    image = np.clip(np.stack([errors[s][1:] for s in steps]), -1, 1)
    from upzoo.metrics.spectrum import ring_frequencies

    step = ring_frequencies(errors[steps[0]])[1]  # one ring's width in cycles per pixel
    top = (len(errors[steps[0]]) - 0.5) * step
    fig, axis = plt.subplots(figsize=(6.4, 4))
    shown = axis.imshow(image, cmap="bwr", vmin=-1, vmax=1, origin="lower", aspect="auto",
                        extent=(0.5 * step, top, -0.5, len(steps) - 0.5))  # fmt: skip
    ticks = sorted({0, len(steps) // 2, len(steps) - 1})
    axis.set_yticks(ticks, [f"{steps[t]:,}" for t in ticks])
    axis.axvline(0.5, color="black", linestyle="--", linewidth=1)
    axis.set_xlabel("radial frequency (cycles per pixel; 0.5 = Nyquist, beyond: the corners)")
    axis.set_ylabel("training step")
    fig.colorbar(shown, ax=axis, ticks=[-1, 0, 1], label="S_gen / S_real − 1 (clipped to ±1)")
    axis.set_title(title or "spectral error over training")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
