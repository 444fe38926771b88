"""The generator testbed's modes side by side (Schwarz et al., NeurIPS 2021): for finished testbed
runs (``upzoo train recipes/testbed_toyset64_*.yaml --out RUN``), a table of PSNR, the spectral error
in the band 0.25-0.5 cycles per pixel and in the corners beyond Nyquist at chosen steps, and one PNG
with each run's spectral error over training (as ``spectral_error_evolution.png``) and the final
spectra of all runs against the real one.

    python tools/testbed_figure.py RUN [RUN ...] [--steps 1000,2500,5000] [--out testbed.png]

A run's label is its folder's name.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import numpy as np

from upzoo.metrics.spectrum import corner_error, ring_frequencies, spectral_error
from upzoo.train.generator_testbed import read_spectra


def metrics_at(run: Path, steps: list[int]) -> dict[int, dict[str, float]]:
    """At each of ``steps`` that was evaluated: the spectral errors from ``spectra.csv`` (by the
    metrics' own definitions; step 0 is the untrained generator) and the PSNR from ``metrics.csv``
    (NaN at step 0, which the task measures only for the spectra)."""
    with open(run / "metrics.csv", newline="") as f:
        psnr = {int(r["step"]): float(r["val_psnr"]) for r in csv.DictReader(f) if r.get("val_psnr")}
    table = read_spectra(run / "spectra.csv")
    values = {}
    for step in (s for s in steps if s in table):
        generated, real = table[step]["generated"], table[step]["real"]
        values[step] = {"val_psnr": psnr.get(step, math.nan), "val_spectral_error": spectral_error(generated, real)[1],
                        "val_spectral_error_corners": corner_error(generated, real)}  # fmt: skip
    return values


def figure(runs: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = {run.name: read_spectra(run / "spectra.csv") for run in runs}
    fig, axes = plt.subplots(1, len(runs) + 1, figsize=(3.2 * (len(runs) + 1), 3.4))
    for axis, (name, table) in zip(axes, tables.items()):
        steps = sorted(table)
        width = ring_frequencies(table[steps[0]]["real"])[1]  # one ring in cycles per pixel
        rings = len(table[steps[0]]["real"])
        image = np.clip(np.stack([table[s]["error"][1:] for s in steps]), -1, 1)
        shown = axis.imshow(image, cmap="bwr", vmin=-1, vmax=1, origin="lower", aspect="auto",
                            extent=(0.5 * width, (rings - 0.5) * width, -0.5, len(steps) - 0.5))  # fmt: skip
        ticks = sorted({0, len(steps) // 2, len(steps) - 1})
        axis.set_yticks(ticks, [f"{steps[t]:,}" for t in ticks])
        axis.axvline(0.5, color="black", linestyle="--", linewidth=1)
        axis.set_title(name, fontsize=10)
        axis.set_xlabel("cycles per pixel")
    axes[0].set_ylabel("training step")
    fig.colorbar(shown, ax=axes[len(runs) - 1], ticks=[-1, 0, 1], label="S_gen / S_real − 1")
    spectra = axes[-1]
    for name, table in tables.items():
        last = table[max(table)]
        frequency = ring_frequencies(last["real"])
        spectra.semilogy(frequency[1:], last["generated"][1:], label=name, linewidth=1)
    spectra.semilogy(frequency[1:], last["real"][1:], color="black", linewidth=2, label="real")
    spectra.axvspan(0.5, frequency[-1], color="grey", alpha=0.12, linewidth=0)
    spectra.set_title("final spectra", fontsize=10)
    spectra.set_xlabel("cycles per pixel")
    spectra.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--steps", default="0,1000,2500,5000", help="evaluation steps of the table")
    parser.add_argument("--out", type=Path, default=Path("testbed.png"))
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    print("| mode | " + " | ".join(f"PSNR / band / corners at {s:,}" for s in steps) + " |")
    print("|---|" + "---|" * len(steps))
    missing = set()
    for run in args.runs:
        values = metrics_at(run, steps)
        missing |= {(run.name, s) for s in steps if s not in values}
        cells = [
            f"{v['val_psnr']:.2f}".replace("nan", "—")
            + f" / {v['val_spectral_error']:.3f} / {v['val_spectral_error_corners']:.3f}"
            if (v := values.get(s))
            else "—"
            for s in steps
        ]
        print(f"| {run.name} | " + " | ".join(cells) + " |")
    if missing:
        evaluated = sorted(read_spectra(args.runs[0] / "spectra.csv"))
        print(f"—: a step the run did not evaluate ({len(missing)} cells); {args.runs[0].name} evaluated "
              f"{', '.join(map(str, evaluated[:8]))}{' ...' if len(evaluated) > 8 else ''}: choose them with "
              f"--steps {','.join(map(str, evaluated[:: max(1, len(evaluated) // 3)]))}", file=sys.stderr)  # fmt: skip
    figure(args.runs, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
