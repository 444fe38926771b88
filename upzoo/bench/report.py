"""The report of a seeded comparison: display rows (mean ± std, paired differences marked when
beyond the seed noise), the error-bar chart, and the files ``compare.json/csv/md`` and
``compare.png`` written into the comparison's folder."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["quality_keys", "display_rows", "evidence_chart", "machine_lines", "seed_note", "write_comparison"]


TITLES = {
    "miou": "mIoU",
    "boundary_iou": "Boundary IoU",
    "boundary_fscore": "Boundary F",
    "thin_iou": "thin IoU",
    "mean_dice": "Dice",
    "dice": "Dice",
    "gm_dice": "GM Dice",
    "wm_dice": "WM Dice",
    "csf_dice": "CSF Dice",
    "hd95": "HD95 mm",
    "gm_hd95": "GM HD95 mm",
    "surface_dice": "surface Dice",
    "gm_surface_dice": "GM surface Dice",
    "psnr_y": "PSNR Y dB",
    "ssim_y": "SSIM Y",
    "ssim": "SSIM",
    "psnr_rgb": "PSNR RGB dB",
    "psnr": "PSNR dB",
    "swd": "SWD",
    "spectral_error": "spectral error",
    "spectral_error_corners": "corner error",
    "spectral_decay": "spectral decay",
    "kid": "KID",
    "fd": "FD",
    "checkerboard": "checkerboard",
}
#: metrics that cannot exceed 1: their axes stop there even where a few seeds' interval reaches past it
AT_MOST_ONE = {"miou", "boundary_iou", "boundary_fscore", "thin_iou", "mean_dice", "surface_dice", "ssim_y", "dice",
               "gm_dice", "wm_dice", "csf_dice", "gm_surface_dice"}  # fmt: skip


def quality_keys(rows: list[dict[str, Any]]) -> list[str]:
    return [key for key in TITLES if f"{key}_mean" in rows[0]]


def _cell(mean: float, std: float) -> str:
    return f"{mean:.3f} ± {std:.3f}" if math.isfinite(std) else f"{mean:.3f}"


def _diff_cell(row: dict[str, Any], key: str) -> str:
    if f"{key}_diff" not in row:
        return "(baseline)"
    d, lo, hi = row[f"{key}_diff"], row[f"{key}_diff_low"], row[f"{key}_diff_high"]
    flag = " **beyond noise**" if row[f"{key}_beyond"] else ""
    return f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]{flag}" if math.isfinite(lo) else f"{d:+.3f}"


def _seeds_cell(row: dict[str, Any]) -> str:
    """``3``, or ``2 of 3`` when cells are missing: a mean over fewer seeds is never silent."""
    planned = row.get("planned_seeds", row["seeds"])
    return str(row["seeds"]) if row["seeds"] == planned else f"{row['seeds']} of {planned}"


def display_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, str]], list[str]]:
    """The table people read: mean ± std per metric, the paired difference to the baseline with its
    95 % interval, speed (median and IQR, ``!`` when unstable), memory, parameters, GFLOPs."""
    keys = quality_keys(rows)
    table = []
    for row in rows:
        line = {"upsampler": row["upsampler"], "seeds": _seeds_cell(row)}
        for key in keys:
            line[TITLES[key]] = _cell(row[f"{key}_mean"], row[f"{key}_std"])
        for key in keys:
            line[f"Δ {TITLES[key]}"] = _diff_cell(row, key)
        spread = f" (IQR {row['ms_q1']:.1f}-{row['ms_q3']:.1f} ms){' !' if row['unstable'] else ''}"
        line[_speed_column(row)] = f"{row['ms']:.1f}{spread}"
        line.update(
            peak_train_MiB=f"{row['peak_train_mib']:.0f}", params=str(row["params"]), GFLOPs=f"{row['gflops']:.2f}"
        )
        table.append(line)
    columns = list(table[0])
    for reference in references(rows[0]):  # the untrained baselines (bicubic), beside the variants
        line = {c: "—" for c in columns} | {"upsampler": f"{reference['label']} (reference, not trained)"}
        table.append(line | {TITLES[k]: f"{reference[k]:.3f}" for k in keys if k in reference})
    return table, columns


def references(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row's untrained baselines: ``reference`` is one (a dict) or several (a list)."""
    reference = row.get("reference")
    return [] if not reference else [reference] if isinstance(reference, dict) else list(reference)


def _speed_column(row: dict[str, Any]) -> str:
    """``ms / image (HxW)``: the input the speed was measured at (a volume: DxHxW; a generator's input
    is a latent vector, so its column is per generated image)."""
    size = row.get("input")
    if size and len(size) < 3:
        return "ms / generated image"
    return f"ms / image ({'x'.join(map(str, size[2:]))})" if size else "ms / image"


def seed_note(rows: list[dict[str, Any]]) -> str:
    """Why the intervals are as wide as they are, where the seeds are few."""
    seeds = min((row["seeds"] for row in rows), default=0)
    if seeds >= 3:
        return ""
    return (
        f"- {seeds} seed(s) per variant: the 95 % intervals use Student's t with {max(seeds - 1, 0)} degree(s) of "
        f"freedom (t = 12.7 for 2 seeds), so they are wide; run more seeds (--seeds 3 or more) to separate variants"
    )


def evidence_chart(rows: list[dict[str, Any]], path: str | Path) -> None:
    """One panel per quality metric (mean as a marker, 95 % interval as error bars, each seed as a
    dot; the axis spans the values, not zero, so that differences of a tenth of a dB show, and stops
    at 1 for metrics that cannot exceed it) and the
    inference time (bars: median, interquartile range as error bars), as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = quality_keys(rows)
    names = [r["upsampler"] for r in rows]
    key_lines = len(names) if max(map(len, names), default=0) > 28 else 0  # long labels: numbered, keyed below
    if key_lines:
        names = [str(i) for i in range(1, len(rows) + 1)]
    fig, axes = plt.subplots(1, len(keys) + 1, figsize=(3.4 * (len(keys) + 1), 3.8 + 0.2 * key_lines))
    for ax, key in zip(axes, keys):
        means = [r[f"{key}_mean"] for r in rows]
        low = [m - r[f"{key}_ci_low"] if math.isfinite(r[f"{key}_ci_low"]) else 0 for m, r in zip(means, rows)]
        high = [r[f"{key}_ci_high"] - m if math.isfinite(r[f"{key}_ci_high"]) else 0 for m, r in zip(means, rows)]
        x = list(range(len(rows)))
        ax.errorbar(x, means, yerr=[low, high], fmt="o", capsize=4, color="#4c72b0", label="mean, 95 % CI")
        for i, r in enumerate(rows):
            ax.plot(
                [i + 0.15] * len(r[f"{key}_per_seed"]), r[f"{key}_per_seed"], "k.", ms=4,
                label="seeds" if i == 0 else None,
            )  # fmt: skip
        for reference, style in zip(references(rows[0]), ("--", ":", "-.")):
            if key in reference:
                ax.axhline(reference[key], color="grey", linestyle=style, label=f"{reference['label']} (not trained)")
        ax.set_xticks(x, names, rotation=40, ha="right")
        ax.set_xlim(-0.5, len(rows) - 0.5)
        if key in AT_MOST_ONE and ax.get_ylim()[1] > 1:
            ax.set_ylim(top=1.0)
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(f"{TITLES[key]} ({rows[0]['seeds']} seeds)")
    ax = axes[-1]
    ms = [r["ms"] for r in rows]
    err = [[m - r["ms_q1"] for m, r in zip(ms, rows)], [r["ms_q3"] - m for m, r in zip(ms, rows)]]
    ax.bar(names, ms, yerr=err, capsize=4, color="#dd8452", label="median, IQR")
    ax.set_title(_speed_column(rows[0]).replace("ms", "inference ms", 1))
    ax.set_xticks(range(len(rows)), names, rotation=40, ha="right")
    for a in axes:
        a.legend(fontsize=7)
    key = "\n".join(f"{i}  {r['upsampler']}" for i, r in enumerate(rows, 1)) if key_lines else ""
    fig.text(0.01, 0.01, key, fontsize=8, va="bottom", family="monospace")
    fig.tight_layout(rect=(0, 0.2 * key_lines / fig.get_figheight() + (0.02 if key_lines else 0), 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def machine_lines(rows: list[dict[str, Any]]) -> str:
    """Where the table's numbers came from: the kinds of machine the cells trained on (with their
    mean training time, per kind), the CPU threads they trained with, whether they were
    deterministic, and where speed was measured."""
    trained = {}
    for row in rows:
        for kind, seconds in row.get("train_seconds_by_machine", {}).items():
            trained.setdefault(kind, []).append(seconds)
    lines = [
        f"- trained on: {kind} (mean {sum(v) / len(v):.0f} s per cell)" for kind, v in sorted(trained.items())
    ] or ["- trained on: not recorded"]
    from upzoo.bench.collect import thread_counts

    threads = ", ".join(map(str, thread_counts(rows)))
    lines.append(f"- CPU threads per cell: {threads or 'not recorded'}")
    flags = sorted({str(row.get("deterministic")) for row in rows})
    lines.append(f"- deterministic cells: {', '.join(flags)}")
    speed = sorted({row["speed_machine"] for row in rows if row.get("speed_machine")})
    lines.append(f"- speed and memory measured on: {', '.join(speed) or 'not measured'}")
    return "\n".join(lines)


def write_comparison(rows: list[dict[str, Any]], out: str | Path) -> tuple[list[dict[str, str]], list[str]]:
    """Write ``compare.json`` (every number), ``compare.csv`` and ``compare.md`` (the display table),
    ``compare.png`` (the chart) and, for generators, ``compare_spectra.png`` (each variant's mean
    spectrum over the real one) into ``out`` atomically; returns the display table and its columns."""
    from upzoo.runtime import atomic_write
    from upzoo.tables import render_table, to_json

    out = Path(out)
    table, columns = display_rows(rows)
    note = seed_note(rows)
    texts = {
        "compare.json": to_json(rows) + "\n",
        "compare.csv": render_table(table, columns, "csv") + "\n",
        "compare.md": render_table(table, columns)
        + "\n\n"
        + machine_lines(rows)
        + "\n"
        + (note + "\n" if note else ""),
    }
    for name, text in texts.items():
        atomic_write(out / name, lambda tmp, text=text: tmp.write_text(text))
    atomic_write(out / "compare.png", lambda tmp: evidence_chart(rows, tmp))
    if rows and rows[0].get("spectrum_real") and all(r.get("spectrum_generated") for r in rows):
        from upzoo.figures import spectrum_plot

        real = np.asarray(rows[0]["spectrum_real"])
        generated = {r["upsampler"]: np.asarray(r["spectrum_generated"]) for r in rows}
        title = f"each variant's spectrum, mean over its seeds ({rows[0]['seeds']})"
        atomic_write(out / "compare_spectra.png", lambda tmp: spectrum_plot(real, generated, tmp, title))
    return table, columns
