"""``bench compare``: upsamplers trained side by side with several seeds, so that a difference can
be told from seed noise. One cell is one variant x seed, trained into ``OUT/<variant>/seed<k>``; a
finished cell of the same recipe is reused, an interrupted one resumed, a foreign one refused. Per
variant: the quality metrics over the seeds (:mod:`.stats`), speed measured interleaved across the
variants, parameters and FLOPs. The tables and chart: :mod:`.report`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from upzoo.bench.speed import inference_call, interleaved_fps
from upzoo.bench.stats import paired_difference, seed_interval
from upzoo.bench.variants import Variant
from upzoo.errors import ConfigError, UpzooError
from upzoo.sections import MAX_SEED

__all__ = ["THIN_CLASSES", "check_variants", "train_seeds", "compare_upsamplers"]

QUALITY_2D = ("miou", "boundary_iou", "boundary_fscore", "thin_iou")
QUALITY_3D = ("mean_dice", "hd95", "surface_dice", "miou")


#: the Cityscapes classes that are thin or small: where upsamplers differ (their mean IoU is reported)
THIN_CLASSES = ("pole", "traffic light", "traffic sign", "person", "rider", "motorcycle", "bicycle")


def check_variants(recipe: Any, variants: Sequence[Variant]) -> None:
    """Build every variant's model on the meta device before anything trains, so that a bad
    option of the last variant is reported before the first one spends hours.

    Raises:
        ConfigError: naming the variant and its problem.
    """
    from upzoo.recipe import check_model_builds

    for variant in variants:
        try:
            check_model_builds(_variant_recipe(recipe, variant, recipe.train.seed).model)
        except UpzooError as exc:
            raise ConfigError(f"variant {variant.label!r}: {exc}") from None


def _variant_recipe(recipe: Any, variant: Variant, seed: int) -> Any:
    from dataclasses import replace

    from upzoo.models import ModelSpec

    options = {**recipe.model.to_dict(), "upsampler": variant.name}
    if variant.options:
        options["upsampler_options"] = {**(options.get("upsampler_options") or {}), **variant.options}
    train = recipe.train.model_copy(update={"seed": seed})
    return replace(recipe, model=ModelSpec.from_dict(options), train=train)


def _quality(val: dict[str, Any], keys: Sequence[str], class_names: Sequence[str] | None) -> dict[str, float]:
    # a reused summary.json holds NaN as null and infinities as "inf"
    values = {key: math.nan if val.get(key) is None else float(val[key]) for key in keys if key != "thin_iou"}
    if "thin_iou" in keys:
        per_class = val.get("per_class_iou") or {}
        if isinstance(per_class, list):  # summaries written before per-class values were keyed by name
            per_class = dict(zip(class_names or [], per_class))
        thin = [per_class[c] for c in THIN_CLASSES if c in per_class]
        thin = [float(v) for v in thin if v is not None and math.isfinite(float(v))]
        values["thin_iou"] = statistics.fmean(thin) if thin else math.nan
    return values


def _finished(folder: Path, prepared: Any) -> tuple[str, dict[str, Any] | None]:
    """What ``folder`` holds for this cell: ``("done", summary)`` — a training of the same recipe
    finished there (so an interrupted ``bench compare`` continues where it stopped) —,
    ``("resume", None)`` — one that was interrupted —, or ``("new", None)``.

    Raises:
        ConfigError: the folder holds a run of another recipe, or a damaged one; naming it.
    """
    import json

    from upzoo.recipe import plain
    from upzoo.yaml_files import read_yaml_file

    summary, recipe = folder / "summary.json", folder / "recipe.yaml"
    if not recipe.is_file() or not (folder / "last.pt").is_file():
        return "new", None
    expected = plain({**prepared.recipe.to_dict(), "model": prepared.model_dict()})
    stored = read_yaml_file(recipe, "run recipe")
    if stored != expected:
        section = next((k for k in ("model", "data", "train", "eval") if stored.get(k) != expected.get(k)), "model")
        raise ConfigError(
            f"{folder} holds a run of another recipe ({section} differs); move it away or compare into another --out"
        )
    try:
        done = json.loads(summary.read_text()) if summary.is_file() else None
    except (OSError, ValueError):
        done = None  # a summary cut short: the run is continued from last.pt and writes it again
    if not isinstance(done, dict) or done.get("interrupted") or not isinstance(done.get("val"), dict):
        return "resume", None
    missing = {k: v for k, v in _last_evaluation(folder / "metrics.csv").items() if done["val"].get(k) is None}
    done["val"].update(missing)  # older summaries hold inf (a missed class) as null; metrics.csv keeps it
    return "done", done


def _last_evaluation(path: Path) -> dict[str, float]:
    """The ``val_*`` values of the last evaluation row of ``metrics.csv`` (where inf stays inf)."""
    import csv

    if not path.is_file():
        return {}
    with open(path, newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("val_miou")]
    last = rows[-1] if rows else {}
    return {key[4:]: float(value) for key, value in last.items() if key.startswith("val_") and value}


def train_seeds(recipe: Any, variant: Variant, seeds: Sequence[int], out: Path, tick: Callable[[], None]):
    """Train ``variant`` once per seed into ``out/<label>/seed<k>`` (a seed finished there before with
    the same recipe is reused); per-seed quality values and the prepared recipe of the last seed
    (for the speed measurement)."""
    from upzoo.prepare import prepare
    from upzoo.train.engine import Trainer
    from upzoo.train.tasks import make_task

    per_seed, prepared = [], None
    for seed in seeds:
        prepared = prepare(_variant_recipe(recipe, variant, seed))
        keys = QUALITY_3D if prepared.recipe.data.kind == "volumes" else QUALITY_2D
        folder = out / variant.label.replace(" ", "_").replace("=", "-") / f"seed{seed}"
        state, summary = _finished(folder, prepared)
        if summary is None:
            summary = Trainer(make_task(prepared), folder, resume=state == "resume", progress=False).fit()
        if summary.get("interrupted"):  # Ctrl-C: last.pt is written; the next bench compare continues it
            raise KeyboardInterrupt
        per_seed.append(_quality(summary.get("val") or {}, keys, prepared.data.class_names))
        tick()
    return per_seed, prepared


def _summarise(label: str, per_seed: list[dict[str, float]], baseline: list[dict[str, float]]) -> dict[str, Any]:
    row: dict[str, Any] = {"upsampler": label, "seeds": len(per_seed)}
    for key in per_seed[0]:
        values = [s[key] for s in per_seed]
        row.update({f"{key}_{k}": v for k, v in seed_interval(values).items()})
        row[f"{key}_per_seed"] = values
        if baseline is not per_seed:
            diff = paired_difference(values, [s[key] for s in baseline])
            row.update({f"{key}_{k}": v for k, v in diff.items()})
    return row


def compare_upsamplers(
    recipe: Any,
    variants: Sequence[Variant],
    out_dir: str | Path,
    *,
    seeds: int = 3,
    baseline: int = 0,
    device: str = "cpu",
    amp: str = "none",
    rounds: int = 10,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Train every variant with seeds ``recipe.train.seed + 0..seeds-1`` (the same for all, so the
    differences are paired), then time them interleaved; one row per variant."""
    from tqdm import tqdm

    from upzoo.bench.block_table import count_flops
    from upzoo.bench.model_table import bench_model
    from upzoo.models import build_model

    if not 0 <= baseline < len(variants):
        raise ConfigError(f"the baseline must be one of the {len(variants)} variants, got index {baseline}")
    seed_list = [recipe.train.seed + k for k in range(seeds)]
    if seed_list[-1] > MAX_SEED:
        raise ConfigError(f"train.seed {recipe.train.seed} + {seeds} seeds passes the largest seed {MAX_SEED}")
    check_variants(recipe, variants)
    bar = tqdm(total=len(variants) * seeds, desc="trainings", unit="run", disable=not progress)
    results, specs = {}, {}
    try:
        for variant in variants:
            bar.set_postfix(upsampler=variant.label)
            out = Path(out_dir)
            results[variant.label], prepared = train_seeds(recipe, variant, seed_list, out, lambda: bar.update(1))
            specs[variant.label] = prepared
    finally:
        bar.close()
    base = results[variants[baseline].label]
    rows = [_summarise(label, per_seed, base) for label, per_seed in results.items()]
    shapes, calls, models = {}, {}, {}
    for label, prepared in specs.items():
        models[label] = build_model(prepared.spec)
        shapes[label] = _input_shape(prepared)
        calls[label] = inference_call(models[label], shapes[label], device, amp)
    speed = interleaved_fps(calls, batch=1, rounds=rounds, device=device)
    for row in rows:
        label = row["upsampler"]
        measured = bench_model(models[label], shapes[label], device=device, runs=2, amp=amp)
        row.update(speed[label])
        row.update(
            peak_train_mib=measured["peak_train_mib"],
            params=measured["params"],
            gflops=count_flops(models[label].cpu().eval(), torch.zeros(shapes[label])) / 1e9,
            input=list(shapes[label]),
            amp=amp,
        )
    return rows


def _input_shape(prepared: Any) -> tuple[int, ...]:
    bundle, data = prepared.data, prepared.recipe.data
    sample = (bundle.val or bundle.train)[0]["image"]
    return (1, *sample.shape) if data.kind != "volumes" else (1, sample.shape[0], *data.crop_size)
