"""The plan of a seeded comparison: one cell per variant x seed, each a fully resolved recipe file, a
run folder and the exact ``upzoo train`` command line that produces it. ``plan.json`` holds the
plan; ``jobs.txt`` holds one shell line per cell, so ``parallel < jobs.txt``, ``sbatch --array``
over its lines or any scheduler can run them. Both hold paths relative to the comparison's folder
(run the lines from it), so the folder can be copied to a cluster or moved whole. Every command ends
in ``--continue``: running a cell again continues it from its ``last.pt``, reports it if finished,
and refuses a folder holding another recipe's run — so re-launching, requeueing or running a line
twice is always safe."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from upzoo.bench.variants import Variant
from upzoo.errors import ConfigError, DataError, UpzooError
from upzoo.runtime import atomic_write
from upzoo.sections import MAX_SEED

__all__ = [
    "Cell",
    "Plan",
    "plan_comparison",
    "write_plan",
    "read_plan",
    "check_variants",
    "variant_recipe",
    "PLAN_FILE",
    "JOBS_FILE",
]

PLAN_FILE, JOBS_FILE = "plan.json", "jobs.txt"


@dataclass(frozen=True)
class Cell:
    """One training of a comparison: ``variant`` (its label) with ``seed``."""

    variant: str
    seed: int
    recipe_file: str  # the resolved recipe of this cell
    recipe_hash: str  # SHA-256 of that file's text: the cell's identity
    folder: str  # its run folder
    log: str  # where a launcher writes its output
    nproc: int = 1  # a multi-process DDP training per cell

    def command(self, python: str | None = None) -> list[str]:
        """The ``upzoo train`` command line of this cell (``python -m upzoo`` with ``python``)."""
        head = [python, "-m", "upzoo"] if python else ["upzoo"]
        ddp = ["--nproc", str(self.nproc)] if self.nproc > 1 else []
        return [*head, "train", self.recipe_file, "--out", self.folder, "--continue", "--no-progress", "--json", *ddp]


@dataclass(frozen=True)
class Plan:
    """A comparison: its variants (labels, in order), the baseline's index, the seeds and the cells."""

    variants: list[str]
    baseline: int
    seeds: list[int]
    cells: list[Cell]
    recipe: dict[str, Any]  # the comparison's base recipe (resolved, before the variant is applied)
    texts: dict[str, str] = field(default_factory=dict, repr=False)  # recipe file -> its YAML (not saved)

    def cells_of(self, variant: str) -> list[Cell]:
        return [c for c in self.cells if c.variant == variant]


def check_variants(recipe: Any, variants: Sequence[Variant]) -> None:
    """Build every variant's model on the meta device before anything trains, so that a bad
    option of the last variant is reported before the first one spends hours.

    Raises:
        ConfigError: naming the variant and its problem.
    """
    from upzoo.recipe import check_model_builds

    for variant in variants:
        try:
            check_model_builds(variant_recipe(recipe, variant, recipe.train.seed).model)
        except UpzooError as exc:
            raise ConfigError(f"variant {variant.label!r}: {exc}") from None


#: variant options that are model keys, not the block's: ``transposed:post_filter=masked_blur``,
#: ``transposed:last_upsampler=interp_conv`` (a generator's last stage alone),
#: ``fade:through_plane_upsampler=transposed`` (a through-plane U-Net's decoder guided, its through-plane
#: block not), and a linear probe's ``jafar:upsampler_run=runs/featup-jafar`` or ``carafe:train_upsampler=true``
MODEL_KEYS = (
    "post_filter", "post_filter_options", "last_upsampler", "last_upsampler_options", "through_plane_upsampler",
    "through_plane_upsampler_options", "upsampler_run", "train_upsampler",
)  # fmt: skip


def variant_recipe(recipe: Any, variant: Variant, seed: int) -> Any:
    """The cell recipe of ``variant`` at ``seed``: the model's upsampler and its options replaced
    (a recipe's own ``upsampler_options`` carry over only to the same upsampler), the model keys
    of :data:`MODEL_KEYS` set on the model, ``train.seed`` set."""
    from dataclasses import replace

    from upzoo.models import ModelSpec

    model = recipe.model.to_dict()
    block_options = {k: v for k, v in variant.options.items() if k not in MODEL_KEYS}
    inherited = (model.get("upsampler_options") or {}) if model.get("upsampler") == variant.name else {}
    options = {**model, "upsampler": variant.name, "upsampler_options": {**inherited, **block_options}}
    options.update({k: v for k, v in variant.options.items() if k in MODEL_KEYS})
    if not options["upsampler_options"]:
        options.pop("upsampler_options")
    train = recipe.train.model_copy(update={"seed": seed})
    return replace(recipe, model=ModelSpec.from_dict(options), train=train)


def _slug(label: str) -> str:
    """A variant's folder name: ``interp_conv mode=nearest`` -> ``interp_conv_mode-nearest``; brackets,
    colons, commas and quotes of a mapping value dropped, any other character outside ``[A-Za-z0-9._-]``
    made ``_``."""
    name = label.replace("=", "-").replace("/", "-")
    name = re.sub(r"[{}\[\]:,'\"]", "", name).replace(" ", "_")
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def plan_comparison(
    recipe: Any, variants: Sequence[Variant], out: str | Path, *, seeds: int = 3, baseline: int = 0, nproc: int = 1
) -> Plan:
    """The cells of ``variants`` x seeds ``recipe.train.seed + 0..seeds-1`` (the same seeds for every
    variant, so differences are paired), every variant's model checked on the meta device first.

    Raises:
        ConfigError: a bad baseline index, seeds past the largest seed, or a variant that does not build.
    """
    if not 0 <= baseline < len(variants):
        raise ConfigError(f"the baseline must be one of the {len(variants)} variants, got index {baseline}")
    seed_list = [recipe.train.seed + k for k in range(seeds)]
    if seed_list[-1] > MAX_SEED:
        raise ConfigError(f"train.seed {recipe.train.seed} + {seeds} seeds passes the largest seed {MAX_SEED}")
    check_variants(recipe, variants)
    out = Path(out).resolve()
    cells, texts = [], {}
    for variant in variants:
        for seed in seed_list:
            name = f"{_slug(variant.label)}/seed{seed}"
            text = yaml.safe_dump(variant_recipe(recipe, variant, seed).to_dict(), sort_keys=False)
            cells.append(
                Cell(
                    variant=variant.label,
                    seed=seed,
                    recipe_file=str(out / "recipes" / f"{_slug(variant.label)}-seed{seed}.yaml"),
                    recipe_hash=hashlib.sha256(text.encode()).hexdigest(),
                    folder=str(out / name),
                    log=str(out / "logs" / f"{_slug(variant.label)}-seed{seed}.log"),
                    nproc=nproc,
                )
            )
            texts[cells[-1].recipe_file] = text
    return Plan([v.label for v in variants], baseline, seed_list, cells, _plain(recipe.to_dict()), texts)


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value))


def write_plan(plan: Plan, out: str | Path) -> Path:
    """Write ``plan.json``, ``jobs.txt`` and every cell's recipe file into ``out`` (atomically).
    A plan already there must be the same plan: a cell's recipe file that exists with other contents
    is refused, naming both hashes.

    Raises:
        ConfigError: ``out`` holds another comparison's cell recipe.
    """
    out = Path(out)
    _check_plan_folder(plan, out)
    for cell in plan.cells:
        path, text = Path(cell.recipe_file), plan.texts[cell.recipe_file]
        if path.is_file() and path.read_text() != text:
            old = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
            raise ConfigError(
                f"{path} holds another recipe for cell {cell.variant} seed {cell.seed} (hash {old}, this plan's "
                f"{cell.recipe_hash[:12]}); compare into another --out, or remove the old comparison"
            )
        atomic_write(path, lambda tmp, text=text: tmp.write_text(text))
    relative = [_moved(cell, lambda path: os.path.relpath(path, out)) for cell in plan.cells]
    data = {k: v for k, v in asdict(plan).items() if k != "texts"} | {"cells": [asdict(c) for c in relative]}
    atomic_write(out / PLAN_FILE, lambda tmp: tmp.write_text(json.dumps(data, indent=2) + "\n"))
    lines = [_job_line(c) for c in relative]  # run from `out`
    atomic_write(out / JOBS_FILE, lambda tmp: tmp.write_text("\n".join(lines) + "\n"))
    for cell in plan.cells:
        Path(cell.log).parent.mkdir(parents=True, exist_ok=True)
    return out / PLAN_FILE


def _job_line(cell: Cell) -> str:
    """The shell line of a cell, from the plan folder: it makes its log's folder itself, so a line runs
    by hand or under any scheduler even where the folder was copied without its empty folders."""
    log = shlex.quote(cell.log)
    return f"mkdir -p {shlex.quote(os.path.dirname(cell.log) or '.')} && {shlex.join(cell.command())} > {log} 2>&1"


def _check_plan_folder(plan: Plan, out: Path) -> None:
    """A plan goes into an empty (or new) folder, or over the same plan: another plan's files, a
    run or a user's files are never replaced.

    Raises:
        ConfigError: naming what differs, or what the folder holds.
    """
    if (out / PLAN_FILE).is_file():
        old = read_plan(out)
        differences = [
            f"{what} {mine} (the plan there: {theirs})"
            for what, mine, theirs in (
                ("variants", plan.variants, old.variants),
                ("seeds", plan.seeds, old.seeds),
                ("baseline", plan.baseline, old.baseline),
                ("processes per cell", {c.nproc for c in plan.cells}, {c.nproc for c in old.cells}),
            )
            if mine != theirs
        ] + ["another base recipe (a changed recipe file or --set)"] * (plan.recipe != old.recipe)
        if differences:
            raise ConfigError(
                f"{out} holds another comparison's plan: this one has {'; '.join(differences)}; plan into another "
                f"--out, or remove the old comparison"
            )
    elif out.is_dir() and (entries := sorted(p.name for p in out.iterdir())):
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise ConfigError(
            f"{out} is not empty ({shown}) and holds no comparison plan; plan into an empty or new --out folder"
        )


def read_plan(out: str | Path) -> Plan:
    """The plan in ``out/plan.json``.

    Raises:
        DataError: no plan there, or one that does not read.
    """
    path = Path(out) / PLAN_FILE
    try:
        data = json.loads(path.read_text())
        root = Path(out).resolve()
        cells = [_moved(Cell(**c), lambda path: str(root / path)) for c in data["cells"]]  # absolute stays
        return Plan(data["variants"], int(data["baseline"]), list(data["seeds"]), cells, data["recipe"])
    except FileNotFoundError:
        raise DataError(f"{path} does not exist; plan a comparison with upzoo bench compare --out {out}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path} is not a readable comparison plan ({type(exc).__name__}: {exc})") from None


def _moved(cell: Cell, move: Any) -> Cell:
    """``cell`` with its recipe file, folder and log passed through ``move`` (plan.json and jobs.txt
    hold them relative to the comparison's folder, so the folder can be moved or copied whole)."""
    return replace(cell, recipe_file=move(cell.recipe_file), folder=move(cell.folder), log=move(cell.log))


def python_command(cell: Cell) -> list[str]:
    """The cell's command run by this interpreter (``python -m upzoo ...``)."""
    return cell.command(sys.executable)
