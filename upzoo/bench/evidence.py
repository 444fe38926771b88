"""``bench compare``: upsamplers trained side by side with several seeds, so that a difference can
be told from seed noise. Per variant: mean ± std and a 95 % confidence interval of each quality
metric over the seeds, the paired difference to a baseline variant (same seeds) with its interval
and whether it lies outside the seed noise; speed measured interleaved across the variants (each
round runs every variant once), with median, interquartile range and a flag when the spread is
large; parameters and FLOPs."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from upzoo.errors import ConfigError, UpzooError
from upzoo.sections import MAX_SEED

__all__ = ["Variant", "parse_variants", "seed_interval", "paired_difference", "interleaved_fps", "THIN_CLASSES"]

#: the Cityscapes classes that are thin or small: where upsamplers differ (their mean IoU is reported)
THIN_CLASSES = ("pole", "traffic light", "traffic sign", "person", "rider", "motorcycle", "bicycle")
SPREAD_LIMIT = 0.2  # interquartile range / median above which a timing is flagged


@dataclass(frozen=True)
class Variant:
    """An upsampler with options: ``interp_conv:mode=bilinear`` -> ``Variant("interp_conv", {...})``."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name + "".join(f" {k}={v}" for k, v in self.options.items())


def parse_variants(text: str) -> list[Variant]:
    """``"transposed,interp_conv:mode=bilinear,sapa:variant=inner"`` -> variants (values as YAML).

    Raises:
        ConfigError: empty names, a malformed option, a variant given twice.
    """
    from upzoo.config import parse_yaml

    variants = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, rest = part.partition(":")
        options = {}
        for pair in filter(None, rest.split(":")):
            key, eq, value = pair.partition("=")
            if not eq or not key.strip():
                raise ConfigError(f"--upsamplers: {part!r} has a malformed option {pair!r}; use NAME:KEY=VALUE")
            options[key.strip()] = parse_yaml(value, f"--upsamplers {part}")
        variants.append(Variant(name.strip(), options))
    if not variants:
        raise ConfigError(f"--upsamplers takes comma-separated block names such as transposed,dysample, got {text!r}")
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--upsamplers names a variant twice: {text!r}")
    return variants


def _t975(n: int) -> float:
    """The 97.5 % quantile of Student's t with ``n - 1`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def seed_interval(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample std and the 95 % confidence interval of the mean (Student's t) of per-seed values.

    >>> r = seed_interval([0.5, 0.6, 0.7])
    >>> round(r["mean"], 3), round(r["std"], 3), round(r["ci_low"], 3), round(r["ci_high"], 3)
    (0.6, 0.1, 0.352, 0.848)
    """
    finite = [float(v) for v in values if v is not None and not math.isnan(v)]  # NaN: undefined, left out
    if not finite or any(math.isinf(v) for v in finite):  # e.g. HD95 of a seed that missed a class
        mean = math.inf if finite else math.nan
        return {"mean": mean, "std": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    mean = statistics.fmean(finite)
    if len(finite) < 2:
        return {"mean": mean, "std": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    std = statistics.stdev(finite)
    half = _t975(len(finite)) * std / math.sqrt(len(finite))
    return {"mean": mean, "std": std, "ci_low": mean - half, "ci_high": mean + half}


def paired_difference(values: Sequence[float], baseline: Sequence[float]) -> dict[str, Any]:
    """The per-seed difference ``values - baseline`` (same seeds): its mean, 95 % interval and
    whether the interval excludes 0 (the difference is outside the seed noise)."""
    diffs = [a - b for a, b in zip(values, baseline) if math.isfinite(a) and math.isfinite(b)]
    interval = seed_interval(diffs)
    outside = len(diffs) > 1 and (interval["ci_low"] > 0 or interval["ci_high"] < 0)
    return {
        "diff": interval["mean"],
        "diff_low": interval["ci_low"],
        "diff_high": interval["ci_high"],
        "beyond": outside,
    }


def interleaved_fps(calls: dict[str, Callable[[], Any]], batch: int, rounds: int, device: str) -> dict[str, dict]:
    """FPS of each call from the median of ``rounds`` interleaved timings (each round runs every
    variant once, so a busy machine slows all alike), the interquartile range, and ``unstable``
    when the IQR exceeds 20 % of the median."""
    from upzoo.bench.speed import compare_calls

    timings = compare_calls(calls, warmup=2, runs=rounds, device=device)
    return {
        label: {
            "fps": batch / t.median,
            "ms": t.median * 1e3,
            "ms_q1": t.q1 * 1e3,
            "ms_q3": t.q3 * 1e3,
            "unstable": t.spread > SPREAD_LIMIT,
        }
        for label, t in timings.items()
    }


def inference_call(model: nn.Module, shape: Sequence[int], device: str, amp: str) -> Callable[[], None]:
    """One inference pass of ``model`` on a fixed input, under the same autocast as everything else."""
    from upzoo.runtime import autocast

    model = model.to(device).eval()
    x = torch.randn(*shape, device=device)
    dev = torch.device(device)

    def run() -> None:
        with torch.inference_mode(), autocast(amp, dev):
            model(x)

    return run


QUALITY_2D = ("miou", "boundary_iou", "boundary_fscore", "thin_iou")
QUALITY_3D = ("mean_dice", "hd95", "surface_dice", "miou")


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

    from upzoo.config import read_yaml_file
    from upzoo.recipe import plain

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

    from upzoo.bench.compare import bench_model, count_flops
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


TITLES = {
    "miou": "mIoU",
    "boundary_iou": "Boundary IoU",
    "boundary_fscore": "Boundary F",
    "thin_iou": "thin IoU",
    "mean_dice": "Dice",
    "hd95": "HD95 mm",
    "surface_dice": "surface Dice",
}


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


def display_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, str]], list[str]]:
    """The table people read: mean ± std per metric, the paired difference to the baseline with its
    95 % interval, speed (median and IQR, ``!`` when unstable), memory, parameters, GFLOPs."""
    keys = quality_keys(rows)
    table = []
    for row in rows:
        line = {"upsampler": row["upsampler"]}
        for key in keys:
            line[TITLES[key]] = _cell(row[f"{key}_mean"], row[f"{key}_std"])
        for key in keys:
            line[f"Δ {TITLES[key]}"] = _diff_cell(row, key)
        spread = f" (IQR {row['ms_q1']:.1f}-{row['ms_q3']:.1f} ms){' !' if row['unstable'] else ''}"
        line["ms / image"] = f"{row['ms']:.1f}{spread}"
        line.update(
            peak_train_MiB=f"{row['peak_train_mib']:.0f}", params=str(row["params"]), GFLOPs=f"{row['gflops']:.2f}"
        )
        table.append(line)
    return table, list(table[0])


def evidence_chart(rows: list[dict[str, Any]], path: str | Path) -> None:
    """One bar chart per quality metric (mean, 95 % interval as error bars, each seed as a dot) and
    the inference time (median, interquartile range as error bars), as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = quality_keys(rows)
    names = [r["upsampler"] for r in rows]
    fig, axes = plt.subplots(1, len(keys) + 1, figsize=(3.4 * (len(keys) + 1), 3.8))
    for ax, key in zip(axes, keys):
        means = [r[f"{key}_mean"] for r in rows]
        low = [m - r[f"{key}_ci_low"] if math.isfinite(r[f"{key}_ci_low"]) else 0 for m, r in zip(means, rows)]
        high = [r[f"{key}_ci_high"] - m if math.isfinite(r[f"{key}_ci_high"]) else 0 for m, r in zip(means, rows)]
        ax.bar(names, means, yerr=[low, high], capsize=4, color="#4c72b0", label="mean, 95 % CI")
        for i, r in enumerate(rows):
            ax.plot(
                [i] * len(r[f"{key}_per_seed"]), r[f"{key}_per_seed"], "k.", ms=4, label="seeds" if i == 0 else None
            )
        ax.set_title(f"{TITLES[key]} ({rows[0]['seeds']} seeds)")
        ax.tick_params(axis="x", rotation=40)
    ax = axes[-1]
    ms = [r["ms"] for r in rows]
    err = [[m - r["ms_q1"] for m, r in zip(ms, rows)], [r["ms_q3"] - m for m, r in zip(ms, rows)]]
    ax.bar(names, ms, yerr=err, capsize=4, color="#dd8452", label="median, IQR")
    ax.set_title("inference ms / image")
    ax.tick_params(axis="x", rotation=40)
    for a in axes:
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
