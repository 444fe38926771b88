"""``upzoo bench``: blocks, a recipe's model, and upsamplers compared by training."""

from __future__ import annotations

import click

from upzoo.cli.common import check_device, default_run_dir, emit_rows, parse_options, parse_scale, parse_shape
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
@click.option("--amp", type=click.Choice(["none", "bf16", "fp16"]), default="none", help="Autocast dtype (fp16: CUDA).")
@click.option("--blocks", "pattern", default=None,
              help="Blocks to measure: names or patterns, comma-separated ('*': all) [default: all but the "
              "image-guided feature upsamplers].")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
def bench_blocks_command(shape: str, scale: str, device: str, runs: int, amp: str, pattern: str | None, as_json: bool,
                         as_csv: bool) -> None:  # fmt: skip
    """Registered upsamplers at one input: params, GFLOPs, forward and forward+backward time and peak
    memory (under --amp autocast), and the checkerboard score of the fresh block, one line of
    progress per block. By default every block but the image-guided feature upsamplers (JBU, JAFAR,
    LoftUp, AnyUp), whose cost belongs at their own ratios (tools/bench_feature_upsamplers.py);
    --blocks '*' adds them."""
    from upzoo.bench.block_table import BLOCK_COLUMNS, bench_blocks, check_block_input, environment_line
    from upzoo.layers import to_ntuple

    check_device(device)
    dims = parse_shape(shape, "--shape")
    check_block_input(dims)
    scales = parse_scale(scale)
    to_ntuple(scales, len(dims) - 2, "--scale")
    names = _block_names(pattern)
    click.echo(f"{environment_line(device)}; input {shape}, scale {scale}, amp {amp}, median of {runs}", err=True)
    rows = bench_blocks(
        dims,
        scale=scales,
        device=device,
        runs=runs,
        amp=amp,
        names=names,
        progress=lambda name: click.echo(f"measuring {name} ...", err=True),
    )
    from upzoo.machine import machine_kind, machine_record

    machine = machine_kind(machine_record(device))  # JSON and CSV rows carry it; the table has the line above
    emit_rows([{**row, "machine": machine} for row in rows], [*BLOCK_COLUMNS, "machine"] if as_json or as_csv
              else BLOCK_COLUMNS, as_json, as_csv)  # fmt: skip


def _block_names(pattern: str | None) -> list[str]:
    """The blocks of ``--blocks`` (names or patterns, comma-separated), or the default list.

    Raises:
        UpzooError: a name or pattern that matches no upsampler (the registered ones named).
    """
    from upzoo.bench.block_table import default_block_names
    from upzoo.registry import list_upsamplers

    if pattern is None:
        return default_block_names()
    names: list[str] = []
    for part in (p.strip() for p in pattern.split(",")):
        matched = list_upsamplers(part, kind="upsampler")
        if not matched:
            raise UpzooError(f"--blocks: {part!r} matches no upsampler; registered: "
                             f"{', '.join(list_upsamplers(kind='upsampler'))}")  # fmt: skip
        names += [n for n in matched if n not in names]
    return names


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
    from upzoo.models.factory import architecture_info
    from upzoo.prepare import resolve_model
    from upzoo.recipe import load_recipe

    check_device(device)
    loaded = load_recipe(recipe)
    spec = resolve_model(loaded)
    model = build_model(spec)
    if input_shape is not None:
        shape = parse_shape(input_shape, "--input")
    elif architecture_info(spec.architecture).latent_input:
        shape = (64, spec.options["latent_dim"])
    else:
        crop = loaded.data.crop_size or loaded.data.synthetic_size or (256, 512)
        shape = (1, spec.options.get("in_channels", 3), *crop)
    torch.manual_seed(0)
    result = bench_model(model, shape, device=device, runs=runs, amp=amp, channels_last=channels_last)
    if as_json:
        click.echo(to_json(result))
        return
    from upzoo.bench.block_table import environment_line

    click.echo(f"{environment_line(device)}; input {shape}")
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
    "--out", "out_dir", default=None, help="Folder for the plan, runs, table and chart [default: runs/compare-<time>]."
)
@click.option("--plan-only", is_flag=True, help="Write plan.json and jobs.txt (one command per cell); train nothing.")
@click.option("--launcher", type=click.Choice(["local", "slurm"]), default="local", help="Where the cells run.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, help="local: cells at once (1: in this process).")
@click.option(
    "--devices",
    default=None,
    help="local: GPUs for the workers, e.g. 0,1,2,3: --jobs x --nproc of them, one per process.",
)
@click.option("--retries", type=click.IntRange(min=0, max=10), default=0, help="Re-launch failed cells this often.")
@click.option("--nproc", type=click.IntRange(min=1), default=1, help="Each cell a DDP training on this many processes.")
@click.option("--partition", default=None, help="slurm: partition.")
@click.option("--time", "time_min", type=click.IntRange(min=1), default=240, help="slurm: minutes per cell.")
@click.option("--gpus-per-cell", type=click.IntRange(min=0), default=1, help="slurm: GPUs per cell.")
@click.option("--cpus-per-cell", type=click.IntRange(min=1), default=8, help="slurm: CPUs per cell.")
@click.option("--array-parallelism", type=click.IntRange(min=1), default=32, help="slurm: cells running at once.")
@click.option(
    "--sbatch", "sbatch", multiple=True, metavar="KEY=VALUE", help="slurm: another sbatch option (repeatable)."
)
@click.option("--device", default="cpu", help="Device for the speed and memory measurements.")
@click.option("--amp", type=click.Choice(["none", "bf16", "fp16"]), default="none", help="Autocast of every pass.")
@click.option("--rounds", type=click.IntRange(min=3), default=10, help="Interleaved timing rounds.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
def bench_compare_command(recipe, upsamplers, seeds, baseline, overrides, out_dir, plan_only, launcher, jobs, devices,
                          retries, nproc, partition, time_min, gpus_per_cell, cpus_per_cell, array_parallelism, sbatch,
                          device, amp, rounds, no_progress, as_json, as_csv) -> None:  # fmt: skip
    """Train RECIPE once per upsampler variant and seed (same seeds for every variant) and tell the
    variants apart from seed noise: per metric mean ± std and a 95 % confidence interval (mIoU,
    Boundary IoU and F-score, thin-class IoU; volumes: Dice, HD95, surface Dice; GAN recipes: SWD,
    spectral error and decay, KID/FD with eval.features, checkerboard, and compare_spectra.png;
    super-resolution: PSNR/SSIM on Y, RGB PSNR, spectral error, checkerboard), the paired
    difference to --baseline with its interval and whether it is beyond the seed noise, inference
    time interleaved across the variants (median, IQR, '!' when the IQR exceeds 20 %), peak training
    memory, parameters, GFLOPs. The comparison is a plan (--out/plan.json, --out/jobs.txt: one
    `upzoo train ... --continue` line per cell), launched here, on local workers or as a Slurm array,
    then collected (as `upzoo bench collect` does): compare.png, compare.csv/md/json in --out. Run the
    same command again to continue an interrupted comparison. A variant's post_filter,
    post_filter_options, (generators) last_upsampler, (through_plane_unet) through_plane_upsampler
    and (linear probes) upsampler_run and train_upsampler go to the model
    (transposed:post_filter=masked_blur, transposed:last_upsampler=interp_conv,
    fade:through_plane_upsampler=transposed, jafar:upsampler_run=runs/featup-jafar); a recipe's own
    upsampler_options carry over only to variants of the same upsampler."""
    from pathlib import Path

    from upzoo.bench.plan import plan_comparison, write_plan

    check_device(device)
    loaded, variants, index = _compare_inputs(recipe, overrides, upsamplers, baseline)
    from upzoo.bench.launchers import check_devices, parse_devices

    gpus = parse_devices(devices)
    if launcher == "local":
        check_devices(gpus, jobs, nproc)  # before anything is planned or written
    out = Path(out_dir or default_run_dir("compare"))
    plan = plan_comparison(loaded, variants, out, seeds=seeds, baseline=index, nproc=nproc)
    write_plan(plan, out)
    echo = (lambda line: None) if no_progress else (lambda line: click.echo(line, err=True))
    options = None
    if launcher == "slurm":
        from upzoo.bench.launchers import SlurmOptions, sbatch_preview
        from upzoo.runtime import atomic_write

        options = SlurmOptions(partition, time_min, gpus_per_cell, cpus_per_cell, array_parallelism,
                               parse_options(sbatch))  # fmt: skip
        script = sbatch_preview(plan, options, out / "slurm")
        (out / "slurm").mkdir(parents=True, exist_ok=True)  # the job folder the script writes its logs into
        atomic_write(out / "slurm.sbatch", lambda tmp: tmp.write_text(script))
    if plan_only:
        click.echo(f"planned {len(plan.cells)} cells: {out / 'plan.json'}, {out / 'jobs.txt'}", err=True)
        return
    if options is not None:
        from upzoo.bench.launchers import launch_slurm, slurm_executor

        launch_slurm(plan, slurm_executor(out / "slurm", options), threads=cpus_per_cell, retries=retries, echo=echo)
    else:
        from upzoo.bench.launchers import launch_local

        launch_local(plan, jobs=jobs, devices=gpus, retries=retries, echo=echo, progress=not no_progress)
    _collect_and_report(out, device, amp, rounds, as_json, as_csv)


def _compare_inputs(recipe, overrides, upsamplers, baseline):
    """The recipe, the variants and the baseline's index, checked before anything is planned."""
    from upzoo.bench.variants import parse_variants
    from upzoo.recipe import load_recipe
    from upzoo.registry import upsampler_info

    variants = parse_variants(upsamplers)
    for variant in variants:  # unknown names and post-filters fail before any training
        if upsampler_info(variant.name).kind != "upsampler":
            raise UpzooError(
                f"--upsamplers: {variant.name!r} is a post-filter, not an upsampler; compare it as a variant's "
                f"post-filter, e.g. transposed:post_filter={variant.name}"
            )
    labels = [v.label for v in variants]
    if baseline is not None and baseline not in labels:
        raise UpzooError(f"--baseline {baseline!r} is not one of the variants: {', '.join(labels)}")
    loaded = load_recipe(recipe, overrides)
    return loaded, variants, labels.index(baseline) if baseline is not None else 0


def _collect_and_report(out, device: str, amp: str, rounds: int, as_json: bool, as_csv: bool) -> None:
    from upzoo.bench.collect import collect_comparison, machine_note
    from upzoo.bench.report import seed_note, write_comparison
    from upzoo.tables import to_json

    rows, missing = collect_comparison(out, device=device, amp=amp, rounds=rounds)
    note = machine_note(rows)
    if note:
        click.echo(f"note: {note}", err=True)
    for item in missing:
        click.echo(f"missing: {item['variant']} seed {item['seed']}: {item['reason']} (log: {item['log']})", err=True)
    if not rows:
        raise UpzooError(f"no cell of {out} has finished yet ({len(missing)} missing); run the plan, then collect")
    table, columns = write_comparison(rows, out)
    click.echo(f"runs, compare.md/csv/json and compare.png in {out}", err=True)
    note = seed_note(rows)
    if note:
        click.echo(note.removeprefix("- "), err=True)
    if as_json:
        click.echo(to_json(rows))
    else:
        emit_rows(table, columns, False, as_csv)
    if missing:
        raise UpzooError(f"{len(missing)} cell(s) missing: the table holds the finished seeds only (see 'seeds')")


@bench.command("collect")
@click.argument("out_dir", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@click.option("--device", default="cpu", help="Device for the speed and memory measurements.")
@click.option("--amp", type=click.Choice(["none", "bf16", "fp16"]), default="none", help="Autocast of every pass.")
@click.option("--rounds", type=click.IntRange(min=3), default=10, help="Interleaved timing rounds.")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
def bench_collect_command(out_dir, device, amp, rounds, as_json, as_csv) -> None:
    """Build the seeded table of the comparison planned in DIR (plan.json) from whatever cells have
    finished — run by bench compare, a local pool, Slurm or your own scheduler over jobs.txt — and
    write compare.png, compare.csv/md/json. Missing or failed cells are listed with their log; exit 1
    while any is missing."""
    from pathlib import Path

    check_device(device)
    _collect_and_report(Path(out_dir), device, amp, rounds, as_json, as_csv)
