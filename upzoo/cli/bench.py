"""``upzoo bench``: blocks, a recipe's model, and upsamplers compared by training."""

from __future__ import annotations

import click

from upzoo.cli.common import check_device, default_run_dir, emit_rows, parse_scale, parse_shape
from upzoo.cli.group import CONTEXT, cli
from upzoo.errors import UpzooError
from upzoo.tables import to_json


@cli.group(context_settings=CONTEXT)
def bench() -> None:
    """Measure blocks and models: parameters, FLOPs, time, FPS, memory, checkerboard artifacts."""


@bench.command("blocks")
@click.option("--shape", default="8x64x64x64", help="Input (B, C, *spatial); 3D with five numbers.")
@click.option("--scale", default="2", help="Int or per-axis, e.g. 1,2,2.")
@click.option("--device", default="cpu", help="cpu or cuda.")
@click.option("--runs", type=click.IntRange(min=1), default=5, help="Timed runs per measurement.")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
def bench_blocks_command(shape: str, scale: str, device: str, runs: int, as_json: bool, as_csv: bool) -> None:
    """Every registered upsampler at one input: params, GFLOPs, forward and forward+backward time,
    peak memory of forward+backward, and the checkerboard score of the fresh block."""
    from upzoo.bench.block_table import BLOCK_COLUMNS, bench_blocks, check_block_input, environment_line
    from upzoo.layers import to_ntuple

    check_device(device)
    dims = parse_shape(shape, "--shape")
    check_block_input(dims)
    scales = parse_scale(scale)
    to_ntuple(scales, len(dims) - 2, "--scale")
    click.echo(f"{environment_line(device)}; input {shape}, scale {scale}, median of {runs}", err=True)
    rows = bench_blocks(
        dims,
        scale=scales,
        device=device,
        runs=runs,
        progress=lambda name: click.echo(f"measuring {name} ...", err=True),
    )
    emit_rows(rows, BLOCK_COLUMNS, as_json, as_csv)


@bench.command("model")
@click.argument("recipe", type=click.Path(exists=True, dir_okay=False))
@click.option("--input", "input_shape", default=None, help="Input shape [default: batch 1 at the crop size].")
@click.option("--device", default="cpu", help="cpu or cuda.")
@click.option("--runs", type=click.IntRange(min=1), default=10, help="Timed iterations.")
@click.option("--amp", type=click.Choice(["none", "bf16", "fp16"]), default="none", help="Autocast dtype.")
@click.option("--channels-last", is_flag=True, help="channels_last memory format.")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
def bench_model_command(
    recipe: str, input_shape: str | None, device: str, runs: int, amp: str, channels_last: bool, as_json: bool
) -> None:
    """FPS and peak memory (inference, training step, with checkpointing) of RECIPE's model."""
    import torch

    from upzoo.bench.model_table import bench_model
    from upzoo.models import build_model
    from upzoo.prepare import resolve_model
    from upzoo.recipe import load_recipe

    check_device(device)
    loaded = load_recipe(recipe)
    spec = resolve_model(loaded)
    model = build_model(spec)
    if input_shape is not None:
        shape = parse_shape(input_shape, "--input")
    elif spec.architecture == "dcgan":
        shape = (64, spec.options["latent_dim"])
    else:
        crop = loaded.data.crop_size or loaded.data.synthetic_size or (256, 512)
        shape = (1, spec.options.get("in_channels", 3), *crop)
    torch.manual_seed(0)
    result = bench_model(model, shape, device=device, runs=runs, amp=amp, channels_last=channels_last)
    if as_json:
        click.echo(to_json(result))
        return
    click.echo(f"{result['device']}, torch {result['torch']}, {result['threads']} threads; input {shape}")
    click.echo(
        f"FPS {result['fps']:.2f} (latency median {result['latency_ms']:.1f} ms, "
        f"q1-q3 {result['latency_q1_ms']:.1f}-{result['latency_q3_ms']:.1f} ms over {runs} runs)"
    )
    click.echo(
        f"peak memory: inference {result['peak_inference_mib']:.0f} MiB, training step "
        f"{result['peak_train_mib']:.0f} MiB"
        + (
            f", with checkpointing {result['peak_train_checkpointing_mib']:.0f} MiB"
            if "peak_train_checkpointing_mib" in result
            else ""
        )
        + f" ({result['memory_method']})"
    )
    click.echo(f"parameters: {result['params']:,}")


@bench.command("compare")
@click.argument("recipe", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--upsamplers",
    required=True,
    help="Comma-separated variants, NAME or NAME:KEY=VALUE, e.g. transposed,interp_conv:mode=bilinear,dysample.",
)
@click.option("--seeds", type=click.IntRange(min=1, max=50), default=3, help="Trainings per variant (seeds).")
@click.option("--baseline", default=None, help="The variant the others are compared with [default: the first].")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a recipe value.")
@click.option(
    "--out", "out_dir", default=None, help="Folder for the runs, table and chart [default: runs/compare-<time>]."
)
@click.option("--device", default="cpu", help="Device for the speed and memory measurements.")
@click.option("--amp", type=click.Choice(["none", "bf16", "fp16"]), default="none", help="Autocast of every pass.")
@click.option("--rounds", type=click.IntRange(min=3), default=10, help="Interleaved timing rounds.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
def bench_compare_command(recipe, upsamplers, seeds, baseline, overrides, out_dir, device, amp, rounds, no_progress,
                          as_json, as_csv) -> None:  # fmt: skip
    """Train RECIPE once per upsampler variant and seed (same seeds for every variant) and tell the
    variants apart from seed noise: per metric mean ± std and a 95 % confidence interval (mIoU,
    Boundary IoU and F-score, thin-class IoU; volumes: Dice, HD95, surface Dice), the paired
    difference to --baseline with its interval and whether it is beyond the seed noise, inference
    time interleaved across the variants (median, IQR, '!' when the IQR exceeds 20 %), peak training
    memory, parameters, GFLOPs. Writes compare.png (error bars), compare.csv, compare.json to --out."""
    from pathlib import Path

    from upzoo.bench.report import write_comparison
    from upzoo.bench.seeded import compare_upsamplers
    from upzoo.bench.variants import parse_variants
    from upzoo.recipe import load_recipe
    from upzoo.registry import upsampler_info
    from upzoo.tables import to_json

    check_device(device)
    variants = parse_variants(upsamplers)
    for variant in variants:  # unknown names and post-filters fail before any training
        if upsampler_info(variant.name).kind != "upsampler":
            raise UpzooError(
                f"--upsamplers: {variant.name!r} is a post-filter, not an upsampler; compare it with "
                f"--set model.post_filter={variant.name} on one variant"
            )
    labels = [v.label for v in variants]
    if baseline is not None and baseline not in labels:
        raise UpzooError(f"--baseline {baseline!r} is not one of the variants: {', '.join(labels)}")
    loaded = load_recipe(recipe, overrides)
    if loaded.task != "segmentation":
        raise UpzooError("bench compare trains segmentation recipes (mIoU); GAN recipes log checkerboard scores")
    out = Path(out_dir or default_run_dir("compare"))
    index = labels.index(baseline) if baseline is not None else 0
    rows = compare_upsamplers(
        loaded, variants, out, seeds=seeds, baseline=index, device=device, amp=amp, rounds=rounds,
        progress=not no_progress,
    )  # fmt: skip
    table, columns = write_comparison(rows, out)
    click.echo(f"runs, compare.md/csv/json and compare.png in {out}", err=True)
    if as_json:
        click.echo(to_json(rows))
    else:
        emit_rows(table, columns, False, as_csv)
