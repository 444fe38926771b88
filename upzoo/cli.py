"""The ``upzoo`` command line: thin commands over the library. Data goes to stdout, messages to
stderr; an :class:`~upzoo.errors.UpzooError` becomes one line and exit code 1."""

from __future__ import annotations

import json
import sys

import click

from upzoo.errors import UpzooError

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True}


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="upzoo")
def cli() -> None:
    """upzoo: pluggable upsamplers for U-Nets and GANs, with shape, speed and artifact tools."""


@cli.command("list")
@click.argument("pattern", default="*")
@click.option("--kind", type=click.Choice(["upsampler", "post_filter"]), default=None, help="Only this kind.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_command(pattern: str, kind: str | None, as_json: bool) -> None:
    """List the registered blocks whose names match PATTERN.

    PATTERN takes shell wildcards, for example '*shuffle*'.
    """
    from upzoo.registry import describe_blocks, list_upsamplers

    rows = describe_blocks(pattern, kind=kind)
    if not rows:
        raise UpzooError(f"no block matches {pattern!r}; registered: {', '.join(list_upsamplers())}")
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from upzoo.tables import render_table

    click.echo(render_table(rows, ["name", "kind", "dims", "params", "description"]))
    click.echo("params: learned parameters at 64 -> 64 channels, scale 2, 2D (3D where 2D is not supported)", err=True)


# -- shapes ------------------------------------------------------------------------------------------
def _parse_shape(text: str, what: str = "shape") -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise UpzooError(f"{what} must look like 1x3x512x1024 (positive ints joined by 'x'), got {text!r}")
    return values


def _parse_scale(text: str) -> int | tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UpzooError(f"--scale must be an int or comma-separated ints like 1,2,2, got {text!r}") from None
    return values[0] if len(values) == 1 else values


def _parse_options(pairs: tuple[str, ...]) -> dict:
    import yaml

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UpzooError(f"options are key=value, got {pair!r}")
        options[key] = yaml.safe_load(value)
    return options


def _load_model(recipe: str):
    """Build the recipe's model on the meta device (no memory, no weights); ``strides: auto`` is
    planned from the recipe's data (the synthetic spacing, or the first volume's header)."""
    import torch

    from upzoo.models import build_model
    from upzoo.train.recipe import load_recipe

    loaded = load_recipe(recipe)
    spec = loaded.model
    if spec.options.get("strides") == "auto":
        spec = spec.resolve_auto_strides(_data_spacing(loaded), loaded.data.crop_size or (64,) * 3)
    with torch.device("meta"):
        return build_model(spec)


def _data_spacing(recipe) -> tuple[float, ...]:
    if recipe.data.root is None:
        return tuple(recipe.data.synthetic_spacing)
    from upzoo.data.volumes import VolumeDataset

    return VolumeDataset(recipe.data.root, "train").spacing(0)


@cli.group(context_settings=CONTEXT)
def shapes() -> None:
    """Output shapes, per-layer traces and valid input sizes, computed without running a model."""


@shapes.command("block")
@click.argument("name")
@click.option("--input", "input_shape", required=True, help="Input shape, e.g. 1x32x16x33x47.")
@click.option("--scale", default="2", help="Int or per-axis, e.g. 1,2,2.")
@click.option("--out-channels", type=int, default=None, help="Output channels [default: the input's].")
@click.option("-o", "--option", "options", multiple=True, help="Block option key=value (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def shapes_block(name: str, input_shape: str, scale: str, out_channels: int | None, options: tuple[str, ...],
                 as_json: bool) -> None:
    """Output shape of registered block NAME for an input shape (analytic, no forward pass)."""
    from upzoo.registry import create_upsampler, upsampler_info

    shape = _parse_shape(input_shape, "--input")
    if len(shape) < 3:
        raise UpzooError(f"--input needs (B, C, *spatial), got {input_shape!r}")
    info = upsampler_info(name)
    block = create_upsampler(
        name, spatial_dims=len(shape) - 2, in_channels=shape[1], out_channels=out_channels or shape[1],
        scale=1 if info.kind == "post_filter" else _parse_scale(scale), **_parse_options(options),
    )
    out = block.output_shape(shape)
    if as_json:
        click.echo(json.dumps({"block": name, "input": shape, "output": out, "scale": block.scale}))
    else:
        from upzoo.layers import format_shape

        click.echo(f"{name}: {format_shape(shape)} -> {format_shape(out)} (scale {'x'.join(map(str, block.scale))})")


@shapes.command("model")
@click.argument("recipe", type=click.Path(exists=True, dir_okay=False))
@click.option("--input", "input_shape", required=True, help="Input shape, e.g. 1x3x512x1024.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def shapes_model(recipe: str, input_shape: str, as_json: bool) -> None:
    """Per-layer table (layer, output shape, parameters) of RECIPE's model on the meta device."""
    from upzoo.shapes import trace
    from upzoo.tables import render_table

    rows = trace(_load_model(recipe), _parse_shape(input_shape, "--input"))
    table = [{"layer": r.name, "type": r.layer, "output": r.output_shape, "params": r.params} for r in rows]
    if as_json:
        click.echo(json.dumps(table, indent=2))
        return
    click.echo(render_table(table, ["layer", "type", "output", "params"]))
    total = sum(r.params for r in rows)
    click.echo(f"{len(rows)} layers, {total:,} parameters in the traced layers", err=True)


@shapes.command("check")
@click.argument("recipe", type=click.Path(exists=True, dir_okay=False))
@click.option("--size", default=None, help="Spatial size to check, e.g. 350x525.")
@click.option("--range", "size_range", default=None, help="List the valid sizes in LOW:HIGH on one axis.")
@click.option("--axis", type=int, default=0, help="Axis for --range.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def shapes_check(recipe: str, size: str | None, size_range: str | None, axis: int, as_json: bool) -> None:
    """Which input sizes RECIPE's model accepts: the rule per axis, a size's verdict, or a range."""
    from upzoo.shapes import ShapeSolver

    if (size is None) == (size_range is None):
        raise UpzooError("give exactly one of --size and --range")
    model = _load_model(recipe)
    solver = ShapeSolver(model)
    rules = [solver.rule(a) for a in range(solver.spatial_dims)]
    policy = getattr(model, "input_policy", None)
    result: dict = {"path": solver.path, "reason": solver.reason or None, "input_policy": policy,
                    "rules": [r.describe() if r else "irregular" for r in rules]}
    if size is not None:
        checks = solver.check(_parse_shape(size, "--size"))
        result["axes"] = [{"axis": c.axis, "size": c.size, "valid": c.valid, "below": c.below, "above": c.above,
                           "padding": c.padding} for c in checks]
    else:
        low, _, high = size_range.partition(":")
        try:
            low_i, high_i = int(low), int(high)
        except ValueError:
            raise UpzooError(f"--range must look like 256:2048, got {size_range!r}") from None
        if not 0 <= axis < solver.spatial_dims or low_i > high_i:
            raise UpzooError(f"--axis must be in 0..{solver.spatial_dims - 1} and LOW <= HIGH")
        result["axis"], result["valid_sizes"] = axis, solver.valid_sizes(axis, low_i, high_i)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    how = "analytic stride arithmetic" if solver.path == "analytic" else f"probing on the meta device ({solver.reason})"
    click.echo(f"path: {how}", err=True)
    for a, rule in enumerate(result["rules"]):
        click.echo(f"axis {a}: {rule}")
    if "axes" in result:
        for c in result["axes"]:
            verdict = "valid" if c["valid"] else (
                f"invalid; nearest valid: {c['below']} below, {c['above']} above (pad {c['padding']})")
            click.echo(f"size {c['size']} on axis {c['axis']}: {verdict}")
        if policy == "pad" and not all(c["valid"] for c in result["axes"]):
            click.echo("input_policy 'pad': the model pads such inputs to the sizes above and crops the output back")
    else:
        sizes = result["valid_sizes"]
        click.echo(f"{len(sizes)} valid sizes in {size_range} on axis {axis}: {' '.join(map(str, sizes))}")


@shapes.command("solve")
@click.option("--in", "in_size", type=int, required=True, help="Input size on the axis.")
@click.option("--out", "out_size", type=int, default=None, help="Wanted output size.")
@click.option("--scale", type=int, default=None, help="Wanted scale instead of --out.")
@click.option("--stride", type=int, required=True, help="Stride of the transposed conv.")
@click.option("--max-kernel", type=int, default=None, help="Largest kernel to consider [default: 2*stride+1].")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def shapes_solve(in_size: int, out_size: int | None, scale: int | None, stride: int, max_kernel: int | None,
                 as_json: bool) -> None:
    """Transposed-conv (kernel, padding, output_padding, dilation) reaching an exact output size."""
    from upzoo.shapes import solve_transposed
    from upzoo.tables import render_table

    solutions = solve_transposed(in_size, out_size, stride=stride, scale=scale, max_kernel=max_kernel)
    rows = [s.to_dict() for s in solutions]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        raise UpzooError(f"no transposed conv with stride {stride} turns {in_size} into "
                         f"{out_size or in_size * (scale or 1)}; try another stride or a larger --max-kernel")
    for row in rows:
        row["checkerboard risk"] = "yes (uneven overlap)" if row.pop("uneven_overlap") else "no"
    click.echo(render_table(rows, ["kernel_size", "padding", "output_padding", "dilation", "checkerboard risk"]))


# -- train and eval ----------------------------------------------------------------------------------
def _default_run_dir(recipe: str | None) -> str:
    import time
    from pathlib import Path

    stem = Path(recipe).stem if recipe else "run"
    return str(Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")


def _launch_torchrun(nproc: int, args: list[str]) -> int:
    """Re-run this command under torchrun with ``nproc`` processes (gloo on CPU, NCCL on CUDA)."""
    import subprocess

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "upzoo", *args]
    click.echo(f"launching: {' '.join(command)}", err=True)
    return subprocess.call(command)


def _resume_recipe(run_dir, recipe: str | None, overrides: tuple[str, ...]):
    """The recipe to continue ``run_dir`` with: its stored model and data, and the train/eval
    sections of RECIPE (or the stored ones) with ``--set`` overrides, e.g. to train longer."""
    import yaml

    from upzoo.train.recipe import apply_overrides, parse_recipe

    stored_path = run_dir / "recipe.yaml"
    if not stored_path.is_file():
        raise UpzooError(f"{run_dir} has no recipe.yaml: is it an upzoo run folder?")
    stored = yaml.safe_load(stored_path.read_text())
    given = stored
    if recipe is not None:
        try:
            given = yaml.safe_load(open(recipe, encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise UpzooError(f"{recipe}: invalid YAML ({exc})") from None
    given = apply_overrides(given, overrides)
    effective = {**given, "model": stored["model"], "data": stored["data"]}
    for section in ("model", "data"):
        theirs, ours = parse_recipe(given, source=recipe).to_dict()[section], stored[section]
        if section == "model" and theirs.get("strides") == "auto":
            theirs = {**theirs, "strides": ours.get("strides")}
        if theirs != ours:
            changed = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            raise UpzooError(f"resuming {run_dir} cannot change {section}.{changed[0]}; only train and eval "
                             f"settings may change, or start a new run")
    return parse_recipe(effective, source=str(stored_path))


@cli.command("train")
@click.argument("recipe", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Override a recipe value, e.g. --set model.upsampler=pixel_shuffle (repeatable).")
@click.option("--resume", "resume_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Continue the run in this folder from its last.pt.")
@click.option("--out", "out_dir", default=None, help="Run folder [default: runs/<recipe>-<time>].")
@click.option("--nproc", type=int, default=1, help="Processes for DistributedDataParallel (launches torchrun).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
def train_command(recipe: str | None, overrides: tuple[str, ...], resume_dir: str | None, out_dir: str | None,
                  nproc: int, no_progress: bool, as_json: bool) -> None:
    """Train RECIPE (segmentation or GAN) into a run folder, or --resume one.

    The run folder holds recipe.yaml (resolved), metrics.csv, last.pt (and best.pt for
    segmentation), PNG curves, prediction grids or GAN samples, and summary.json. Ctrl-C stops after
    the current step and saves last.pt; continue with --resume RUN_DIR.
    """
    import os
    from pathlib import Path

    from upzoo.train.recipe import load_recipe, parse_recipe

    if recipe is None and resume_dir is None:
        raise UpzooError("give a RECIPE to train, or --resume RUN_DIR to continue a run")
    if nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        out = resume_dir or out_dir or _default_run_dir(recipe)
        args = ["train"] + ([recipe] if recipe else []) + [a for o in overrides for a in ("--set", o)]
        args += ["--resume", out] if resume_dir else ["--out", out]
        args += ["--no-progress"] if no_progress else []
        sys.exit(_launch_torchrun(nproc, args))
    if resume_dir is not None:
        loaded = _resume_recipe(Path(resume_dir), recipe, overrides)
        run_dir = resume_dir
    else:
        loaded = load_recipe(recipe, overrides)
        run_dir = out_dir or _default_run_dir(recipe)
        if (Path(run_dir) / "last.pt").exists():
            raise UpzooError(f"{run_dir} already holds a run; use --resume {run_dir} or another --out")
    if loaded.task == "gan":
        from upzoo.train.gan import train_gan as run
    else:
        from upzoo.train.segmentation import train_segmentation as run
    summary = run(loaded, run_dir, resume=resume_dir is not None, progress=not no_progress)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=float))
    else:
        click.echo(f"run folder: {summary['run_dir']}")
        click.echo(f"steps: {summary['steps']} of {summary['total_steps']}")
        val = summary.get("val") or {}
        if val:
            click.echo(f"val mIoU: {val['miou']:.4f}  pixel accuracy: {val['pixel_accuracy']:.4f}  "
                       f"mean Dice: {val['mean_dice']:.4f}  (best mIoU {summary['best_miou']:.4f})")
        if "checkerboard" in summary:
            click.echo(f"checkerboard score of the samples: {summary['checkerboard']:.4f}")
    if summary["interrupted"]:
        click.echo(f"interrupted at step {summary['steps']}; continue with: upzoo train --resume {summary['run_dir']}",
                   err=True)
        sys.exit(130)


@cli.command("eval")
@click.argument("recipe", type=click.Path(exists=True, dir_okay=False))
@click.option("--checkpoint", required=True, type=click.Path(exists=True, dir_okay=False),
              help="A last.pt or best.pt of a run of this recipe.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a recipe value.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def eval_command(recipe: str, checkpoint: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Evaluate a segmentation CHECKPOINT on RECIPE's validation split: per-class IoU, mIoU, Dice."""
    from upzoo.eval import evaluate_checkpoint
    from upzoo.tables import render_table
    from upzoo.train.recipe import load_recipe

    result = evaluate_checkpoint(load_recipe(recipe, overrides), checkpoint)
    if as_json:
        click.echo(json.dumps(result, indent=2, default=float))
        return
    rows = [{"class": name, "IoU": iou, "Dice": dice}
            for name, iou, dice in zip(result["class_names"], result["per_class_iou"], result["per_class_dice"])]
    click.echo(render_table(rows, ["class", "IoU", "Dice"]))
    click.echo(f"\nmIoU {result['miou']:.4f}  pixel accuracy {result['pixel_accuracy']:.4f}  "
               f"mean Dice {result['mean_dice']:.4f}  ({result['samples']} validation samples)")


# -- bench -------------------------------------------------------------------------------------------
def _emit(rows: list[dict], columns: list[str], as_json: bool, as_csv: bool) -> None:
    from upzoo.tables import render_table

    click.echo(render_table(rows, columns, "json" if as_json else "csv" if as_csv else "markdown"))


@cli.group(context_settings=CONTEXT)
def bench() -> None:
    """Measure blocks and models: parameters, FLOPs, time, FPS, memory, checkerboard artifacts."""


@bench.command("blocks")
@click.option("--shape", default="8x64x64x64", help="Input (B, C, *spatial); 3D with five numbers.")
@click.option("--scale", default="2", help="Int or per-axis, e.g. 1,2,2.")
@click.option("--device", default="cpu", help="cpu or cuda.")
@click.option("--runs", type=int, default=5, help="Timed runs per measurement.")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
def bench_blocks_command(shape: str, scale: str, device: str, runs: int, as_json: bool, as_csv: bool) -> None:
    """Every registered upsampler at one input: params, GFLOPs, forward and forward+backward time,
    peak memory of forward+backward, and the checkerboard score of the fresh block."""
    from upzoo.bench.compare import BLOCK_COLUMNS, bench_blocks, environment_line

    _check_device(device)
    dims = _parse_shape(shape, "--shape")
    click.echo(f"{environment_line(device)}; input {shape}, scale {scale}, median of {runs}", err=True)
    rows = bench_blocks(dims, scale=_parse_scale(scale), device=device, runs=runs,
                        progress=lambda name: click.echo(f"measuring {name} ...", err=True))
    _emit(rows, BLOCK_COLUMNS, as_json, as_csv)


@bench.command("model")
@click.argument("recipe", type=click.Path(exists=True, dir_okay=False))
@click.option("--input", "input_shape", default=None, help="Input shape [default: batch 1 at the crop size].")
@click.option("--device", default="cpu", help="cpu or cuda.")
@click.option("--runs", type=int, default=10, help="Timed iterations.")
@click.option("--amp", type=click.Choice(["none", "bf16", "fp16"]), default="none", help="Autocast dtype.")
@click.option("--channels-last", is_flag=True, help="channels_last memory format.")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
def bench_model_command(recipe: str, input_shape: str | None, device: str, runs: int, amp: str, channels_last: bool,
                        as_json: bool) -> None:
    """FPS and peak memory (inference, training step, with checkpointing) of RECIPE's model."""
    import torch

    from upzoo.bench.compare import bench_model
    from upzoo.models import build_model
    from upzoo.train.recipe import load_recipe

    _check_device(device)
    loaded = load_recipe(recipe)
    spec = loaded.model
    if spec.options.get("strides") == "auto":
        spec = spec.resolve_auto_strides(_data_spacing(loaded), loaded.data.crop_size or (64,) * 3)
    model = build_model(spec)
    if input_shape is not None:
        shape = _parse_shape(input_shape, "--input")
    elif spec.architecture == "dcgan":
        shape = (64, spec.options["latent_dim"])
    else:
        crop = loaded.data.crop_size or loaded.data.synthetic_size or (256, 512)
        shape = (1, spec.options.get("in_channels", 3), *crop)
    torch.manual_seed(0)
    result = bench_model(model, shape, device=device, runs=runs, amp=amp, channels_last=channels_last)
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
        return
    click.echo(f"{result['device']}, torch {result['torch']}, {result['threads']} threads; input {shape}")
    click.echo(f"FPS {result['fps']:.2f} (latency median {result['latency_ms']:.1f} ms, "
               f"q1-q3 {result['latency_q1_ms']:.1f}-{result['latency_q3_ms']:.1f} ms over {runs} runs)")
    click.echo(f"peak memory: inference {result['peak_inference_mib']:.0f} MiB, training step "
               f"{result['peak_train_mib']:.0f} MiB"
               + (f", with checkpointing {result['peak_train_checkpointing_mib']:.0f} MiB"
                  if "peak_train_checkpointing_mib" in result else "")
               + f" ({result['memory_method']})")
    click.echo(f"parameters: {result['params']:,}")


@bench.command("compare")
@click.argument("recipe", type=click.Path(exists=True, dir_okay=False))
@click.option("--upsamplers", required=True, help="Comma-separated registered names, e.g. transposed,dysample.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a recipe value.")
@click.option("--out", "out_dir", default=None, help="Folder for the runs, table and chart [default: runs/compare-<time>].")
@click.option("--device", default="cpu", help="Device for the FPS and memory measurements.")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
def bench_compare_command(recipe: str, upsamplers: str, overrides: tuple[str, ...], out_dir: str | None, device: str,
                          as_json: bool, as_csv: bool) -> None:
    """Train and evaluate RECIPE once per upsampler (same budget and seed): upsampler | mIoU | FPS |
    peak memory | params, as a table plus compare.png, compare.csv and compare.json in --out."""
    from pathlib import Path

    from upzoo.bench.compare import COMPARE_COLUMNS, bar_chart, compare_upsamplers
    from upzoo.registry import upsampler_info
    from upzoo.tables import render_table
    from upzoo.train.recipe import load_recipe

    _check_device(device)
    names = [n.strip() for n in upsamplers.split(",") if n.strip()]
    for name in names:
        upsampler_info(name)  # unknown names fail before any training
    loaded = load_recipe(recipe, overrides)
    if loaded.task != "segmentation":
        raise UpzooError("bench compare trains segmentation recipes (mIoU); GAN recipes log checkerboard scores")
    out = Path(out_dir or _default_run_dir("compare"))
    rows = compare_upsamplers(loaded, names, out, device=device)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.csv").write_text(render_table(rows, COMPARE_COLUMNS, "csv") + "\n")
    (out / "compare.json").write_text(render_table(rows, COMPARE_COLUMNS + ["steps", "input"], "json") + "\n")
    bar_chart(rows, out / "compare.png")
    click.echo(f"runs, compare.csv/json and compare.png in {out}", err=True)
    _emit(rows, COMPARE_COLUMNS, as_json, as_csv)


def _check_device(device: str) -> None:
    import torch

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UpzooError(f"--device must be cpu or cuda, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UpzooError("--device cuda: no CUDA device is available here; use --device cpu")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``upzoo`` console script."""
    try:
        cli.main(args=argv, prog_name="upzoo", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except UpzooError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
