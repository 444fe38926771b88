"""Collecting a comparison from its run folders, whichever launcher (or a user's own scheduler) ran
them: per variant the quality of every finished cell, statistics over the seeds that finished (the
table says how many of the planned seeds each variant has), paired differences to the baseline over
the seeds both have, and speed measured here, interleaved. Missing and failed cells are listed with
their log and error; nothing is averaged over fewer seeds silently."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from upzoo.bench.cells import last_error
from upzoo.bench.plan import Cell, Plan, read_plan
from upzoo.bench.stats import paired_difference, seed_interval
from upzoo.runs.identity import first_difference, is_finished
from upzoo.yaml_files import read_yaml_file

__all__ = [
    "collect_comparison",
    "cell_outcome",
    "quality_of",
    "cells_machines",
    "thread_counts",
    "machine_note",
    "THIN_CLASSES",
]

QUALITY_2D = ("miou", "boundary_iou", "boundary_fscore", "thin_iou")
QUALITY_3D = ("mean_dice", "hd95", "surface_dice", "miou")
#: those a generator run has (KID and FD only with features)
QUALITY_SR = ("psnr_y", "ssim_y", "psnr_rgb", "spectral_error", "checkerboard")
QUALITY_GAN = ("swd", "spectral_error", "spectral_error_corners", "spectral_decay", "kid", "fd", "checkerboard")
QUALITY_TESTBED = ("psnr", "spectral_error", "spectral_error_corners")
QUALITY_THROUGH_PLANE = ("psnr", "ssim")
#: segmentation from thick slices: the mean Dice over the three tissues, each tissue's, and grey matter's surface
QUALITY_TISSUE = ("dice", "gm_dice", "wm_dice", "csf_dice", "gm_hd95", "gm_surface_dice")

#: the Cityscapes classes that are thin or small: where upsamplers differ (their mean IoU is reported)
THIN_CLASSES = ("pole", "traffic light", "traffic sign", "person", "rider", "motorcycle", "bicycle")


def quality_of(val: dict[str, Any], keys: Sequence[str], class_names: Sequence[str] | None = None) -> dict[str, float]:
    """The comparison's quality values from a run's ``summary.json`` ``val`` (NaN is null there,
    infinities are ``"inf"``); ``thin_iou`` is the mean IoU over :data:`THIN_CLASSES`."""
    values = {key: math.nan if val.get(key) is None else float(val[key]) for key in keys if key != "thin_iou"}
    if "thin_iou" in keys:
        per_class = val.get("per_class_iou") or {}
        if isinstance(per_class, list):  # summaries written before per-class values were keyed by name
            per_class = dict(zip(class_names or [], per_class))
        thin = [per_class[c] for c in THIN_CLASSES if c in per_class]
        thin = [float(v) for v in thin if v is not None and math.isfinite(float(v))]
        values["thin_iou"] = statistics.fmean(thin) if thin else math.nan
    return values


def input_shape(recipe_file: str | Path) -> tuple[int, ...]:
    """The input the comparison times models at: a validation sample of the recipe's data (for a
    generator: one latent)."""
    from upzoo.prepare import prepare
    from upzoo.recipe import load_recipe

    recipe = load_recipe(recipe_file)
    from upzoo.models.factory import architecture_info

    if architecture_info(recipe.model.architecture).latent_input:
        return (1, recipe.model.options["latent_dim"])
    prepared = prepare(recipe)
    bundle, data = prepared.data, prepared.recipe.data
    sample = (bundle.val or bundle.train)[0]["image"]
    return (1, *sample.shape) if data.kind != "volumes" else (1, sample.shape[0], *data.crop_size)


def cell_outcome(cell: Cell) -> tuple[dict[str, Any] | None, str]:
    """``(summary, "")`` for a finished cell, else ``(None, why not)``."""
    folder = Path(cell.folder)
    summary_file, recipe_file = folder / "summary.json", folder / "recipe.yaml"
    if recipe_file.is_file():
        try:
            stored, wanted = read_yaml_file(recipe_file, "run recipe"), read_yaml_file(cell.recipe_file, "cell recipe")
        except Exception as exc:  # an unreadable recipe is this cell's problem, not the collection's
            return None, f"{recipe_file}: {exc}"
        difference = first_difference(stored, wanted)
        if difference is not None:
            return None, f"{folder} holds a run of another recipe than {cell.recipe_file} ({difference})"
    try:
        summary = json.loads(summary_file.read_text())
    except (OSError, ValueError):
        summary = None
    if is_finished(summary):
        return summary, ""
    if (folder / "last.pt").is_file():
        return None, "unfinished (run the plan again: it continues from last.pt)"
    return None, last_error(cell.log) if Path(cell.log).is_file() else "not run yet"


def _row(label: str, mine: dict[int, dict], base: dict[int, dict], planned: int, is_base: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"upsampler": label, "seeds": len(mine), "planned_seeds": planned}
    seeds = sorted(mine)
    for key in mine[seeds[0]]:
        values = [mine[s][key] for s in seeds]
        row.update({f"{key}_{k}": v for k, v in seed_interval(values).items()})
        row[f"{key}_per_seed"] = values
        common = sorted(set(mine) & set(base))
        if not is_base and common:
            diff = paired_difference([mine[s][key] for s in common], [base[s][key] for s in common])
            row.update({f"{key}_{k}": v for k, v in diff.items()})
    return row


def collect_comparison(
    out: str | Path, *, device: str = "cpu", amp: str = "none", rounds: int = 10
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(rows, missing)``: one row per variant with at least one finished cell (see the module),
    and one entry per missing or failed cell (variant, seed, reason, log).

    Raises:
        DataError: no readable plan in ``out``.
    """
    plan = read_plan(out)
    from upzoo.models.factory import architecture_info

    task = architecture_info(plan.recipe["model"].get("architecture", "unet")).task
    volumes = plan.recipe["data"]["kind"] == "volumes"
    keys = {"gan": QUALITY_GAN, "super_resolution": QUALITY_SR, "generator_testbed": QUALITY_TESTBED,
            "through_plane_sr": QUALITY_THROUGH_PLANE, "through_plane_segmentation": QUALITY_TISSUE,
            }.get(task, QUALITY_3D if volumes else QUALITY_2D)  # fmt: skip
    gan = task in ("gan", "generator_testbed")  # generators: their spectra are plotted
    finished: dict[str, dict[int, dict]] = {label: {} for label in plan.variants}
    spectra: dict[str, list] = {label: [] for label in plan.variants}  # generators: for compare_spectra.png
    ran_on: dict[str, list[dict]] = {label: [] for label in plan.variants}  # machine, determinism, time
    missing = []
    for cell in plan.cells:
        summary, reason = cell_outcome(cell)
        if summary is None:
            missing.append({"variant": cell.variant, "seed": cell.seed, "reason": reason, "log": cell.log})
        else:
            present = [k for k in keys if k in summary["val"]] if gan else keys  # KID/FD need features
            finished[cell.variant][cell.seed] = quality_of(summary["val"], present)
            spectra[cell.variant].append(summary.get("spectrum_generated"))
            spectra["real"] = [summary.get("spectrum_real")]
            ran_on[cell.variant].append(summary)
    base = finished[plan.variants[plan.baseline]]
    rows = [
        {
            **_row(label, finished[label], base, len(plan.seeds), i == plan.baseline),
            **cells_machines(ran_on[label]),
        }
        for i, label in enumerate(plan.variants)
        if finished[label]
    ]
    _measure_speed(plan, rows, device, amp, rounds)
    reference = _reference(task, [s for summaries in ran_on.values() for s in summaries], keys)
    for row in rows:
        if reference:
            row["reference"] = reference
    if gan:
        for row in rows:
            row["spectrum_generated"] = _mean_spectrum(spectra[row["upsampler"]])
            row["spectrum_real"] = _mean_spectrum(spectra.get("real", []))
    return rows, missing


def _reference(task: str, summaries: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any] | list | None:
    """What every variant is measured against without training, where the task has it: bicubic
    upscaling for super-resolution (the same held-out images in every cell), linear, cubic and
    B-spline interpolation for through-plane super-resolution (a list), the label-free k-means
    baseline and the oracle labels of the thick grid for segmentation from thick slices (a list),
    the held-out real images' spectral decay for a GAN (the value each generator's decay is judged
    against), the untrained generator for the testbed (its mean over the cells: each cell starts from
    its own seed)."""
    if task == "super_resolution" and summaries:
        val = summaries[0]["val"]
        return {"label": "bicubic", **{k: float(val[f"bicubic_{k}"]) for k in keys if f"bicubic_{k}" in val}}
    if task == "through_plane_sr" and summaries:  # the interpolations of the same held-out block
        val = summaries[0]["val"]
        names = {"linear": "linear", "cubic": "cubic convolution", "bspline": "cubic B-spline"}
        return [{"label": f"{label} interpolation", **{k: float(val[f"{m}_{k}"]) for k in keys}}
                for m, label in names.items()]  # fmt: skip
    if task == "through_plane_segmentation" and summaries:  # the same held-out block's references
        val = summaries[0]["val"]
        if "oracle_dice" not in val:  # runs written before the label-free baseline: thick_* was the oracle
            return {
                "label": "oracle thick-grid labels (true slab majority)",
                **{k: float(val[f"thick_{k}"]) for k in keys},
            }
        return [
            {"label": "label-free k-means of cubic-interpolated T1", **{k: float(val[f"kmeans_{k}"]) for k in keys}},
            {"label": "oracle thick-grid labels (true slab majority)", **{k: float(val[f"oracle_{k}"]) for k in keys}},
        ]
    if task == "gan" and summaries and "spectral_decay_real" in summaries[0].get("val", {}):
        return {
            "label": "the held-out real images",
            "spectral_decay": float(summaries[0]["val"]["spectral_decay_real"]),
        }
    untrained = [s["untrained"] for s in summaries if isinstance(s.get("untrained"), dict)]
    if task == "generator_testbed" and untrained:
        means = {k: statistics.fmean(u[k] for u in untrained) for k in keys if all(k in u for u in untrained)}
        return {"label": "the untrained generator", **means}
    return None


def cells_machines(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a variant's finished cells ran: ``machines`` (the kinds, sorted), ``threads`` (the CPU
    thread counts they trained with, sorted; a seed repeats a cell only with the same count, which
    sets the order of every reduction), ``deterministic`` (``True``, ``False`` or ``"mixed"``;
    ``None`` for runs that predate the record) and ``train_seconds_by_machine`` (mean training time
    per kind: times of two kinds are never averaged)."""
    from upzoo.machine import machine_kind

    seconds: dict[str, list[float]] = {}
    for summary in summaries:
        seconds.setdefault(machine_kind(summary.get("machine")), []).append(float(summary.get("seconds", math.nan)))
    flags = {summary.get("deterministic") for summary in summaries}
    threads = {(summary.get("machine") or {}).get("threads") for summary in summaries}
    return {
        "machines": sorted(seconds),
        "threads": sorted(t for t in threads if t is not None),
        "deterministic": flags.pop() if len(flags) == 1 else "mixed",
        "train_seconds_by_machine": {kind: statistics.fmean(values) for kind, values in sorted(seconds.items())},
    }


def thread_counts(rows: list[dict[str, Any]]) -> list[int]:
    """The CPU thread counts the cells of ``rows`` trained with, sorted (from ``cells_machines``)."""
    return sorted({count for row in rows for count in row.get("threads", [])})


def machine_note(rows: list[dict[str, Any]]) -> str:
    """A line for a table whose cells ran on more than one kind of machine or trained with more than
    one CPU thread count ('' when neither)."""
    kinds = sorted({kind for row in rows for kind in row.get("machines", [])})
    threads = thread_counts(rows)
    lines = []
    if len(kinds) > 1:
        lines.append(
            f"the cells ran on {len(kinds)} kinds of machine ({'; '.join(kinds)}): their training times are kept "
            "apart (train_seconds_by_machine); the speed columns were measured here, interleaved"
        )
    if len(threads) > 1:
        lines.append(
            f"the cells trained with {' and '.join(map(str, threads))} CPU threads: a seed repeats a cell's "
            "numbers only with the thread count it trained with (the threads set the order of the sums)"
        )
    return "; ".join(lines)


def _mean_spectrum(spectra: list) -> list[float] | None:
    """The mean over seeds of a variant's generated spectra (``None`` when a run has none)."""
    if not spectra or any(s is None for s in spectra):
        return None
    import numpy as np

    return np.mean(np.asarray(spectra, dtype=np.float64), axis=0).tolist()


def _measure_speed(plan: Plan, rows: list[dict[str, Any]], device: str, amp: str, rounds: int) -> None:
    """Speed, memory, parameters and FLOPs of each variant's model, timed interleaved here."""
    from upzoo.bench.block_table import count_flops
    from upzoo.bench.model_table import bench_model
    from upzoo.bench.speed import inference_call, interleaved_fps
    from upzoo.machine import machine_kind, machine_record
    from upzoo.models import ModelSpec, build_model

    if not rows:
        return
    models, shape = {}, None
    for row in rows:
        cell = next(c for c in plan.cells_of(row["upsampler"]) if (Path(c.folder) / "recipe.yaml").is_file())
        stored = read_yaml_file(Path(cell.folder) / "recipe.yaml", "run recipe")
        models[row["upsampler"]] = build_model(ModelSpec.from_dict(stored["model"]))
        shape = shape or input_shape(cell.recipe_file)
    calls = {label: inference_call(model, shape, device, amp) for label, model in models.items()}
    speed = interleaved_fps(calls, batch=1, rounds=rounds, device=device)
    for row in rows:
        model = models[row["upsampler"]]
        measured = bench_model(model, shape, device=device, runs=2, amp=amp)
        row.update(speed[row["upsampler"]])
        row.update(
            peak_train_mib=measured["peak_train_mib"],
            params=measured["params"],
            gflops=count_flops(model.cpu().eval(), torch.zeros(shape)) / 1e9,
            input=list(shape),
            amp=amp,
            speed_machine=machine_kind(machine_record(device)),
        )
