"""A comparison's validation curves as a table: per variant and evaluation step, the mean ± std over the
seeds of a ``metrics.csv`` column (how many steps a variant needs to pass a reference), with the
number of seeds above it.

    python tools/cell_curves.py runs/tissue-long --column val_gm_dice --above 0.9168
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from upzoo.bench.plan import read_plan


def curves(folder: Path, column: str) -> dict[str, dict[int, list[float]]]:
    """``{variant: {step: [value per seed]}}`` from every finished or unfinished cell's metrics.csv."""
    plan, found = read_plan(folder), {}
    for cell in plan.cells:
        path = folder / cell.folder / "metrics.csv"
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get(column):
                    found.setdefault(cell.variant, {}).setdefault(int(row["step"]), []).append(float(row[column]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a bench compare --out folder")
    parser.add_argument("--column", required=True, help="a metrics.csv column, e.g. val_gm_dice")
    parser.add_argument("--above", type=float, default=None, help="count the seeds above this reference")
    args = parser.parse_args()
    table = curves(args.folder, args.column)
    if not table:
        raise SystemExit(f"{args.folder}: no cell has logged {args.column!r}")
    steps = sorted({s for per_step in table.values() for s in per_step})
    print(f"| variant | {' | '.join(f'step {s}' for s in steps)} |")
    print(f"|---|{'---|' * len(steps)}")
    for variant, per_step in table.items():
        cells = []
        for step in steps:
            values = per_step.get(step, [])
            spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
            above = f" ({sum(v > args.above for v in values)}/{len(values)} above)" if args.above is not None else ""
            cells.append(f"{statistics.fmean(values):.3f}{spread}{above}" if values else "—")
        print(f"| {variant} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
