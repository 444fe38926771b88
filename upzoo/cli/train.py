"""``upzoo train`` and ``upzoo eval``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from upzoo.cli.common import default_run_dir
from upzoo.cli.group import cli
from upzoo.errors import UsageError
from upzoo.tables import to_json

if TYPE_CHECKING:
    from upzoo.recipe import Recipe


def _launch_torchrun(nproc: int, args: list[str]) -> int:
    """Re-run this command under torchrun with ``nproc`` processes (gloo on CPU, NCCL on CUDA); a
    rank's error reaches the user as its one line (:mod:`upzoo.cli.torchrun`)."""
    import subprocess

    command = [
        sys.executable,
        "-m",
        "upzoo.cli.torchrun",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "upzoo",
        *args,
    ]
    click.echo(f"launching: {' '.join(command)}", err=True)
    return subprocess.call(command)


@cli.command("train")
@click.argument("recipe", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override a recipe value, e.g. --set model.upsampler=pixel_shuffle (repeatable).",
)
@click.option(
    "--resume",
    "resume_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Continue the run in this folder from its last.pt.",
)
@click.option("--out", "out_dir", default=None, help="Run folder [default: runs/<recipe>-<time>].")
@click.option(
    "--continue",
    "continue_",
    is_flag=True,
    help="With --out: continue the run there if it is unfinished, report it if finished, start it if absent "
    "(safe to run again, as requeued jobs do; a run of another recipe is refused).",
)
@click.option(
    "--nproc", type=click.IntRange(min=1), default=1, help="Processes for DistributedDataParallel (launches torchrun)."
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
def train_command(
    recipe: str | None,
    overrides: tuple[str, ...],
    resume_dir: str | None,
    out_dir: str | None,
    continue_: bool,
    nproc: int,
    no_progress: bool,
    as_json: bool,
) -> None:
    """Train RECIPE (segmentation, GAN, super-resolution, feature upsampling or the generator
    testbed: the task follows model.architecture) into a run folder, or --resume one.

    The run folder holds recipe.yaml (resolved), metrics.csv, last.pt (and best.pt by the task's
    validation metric, GANs apart), PNG curves, prediction grids, GAN samples or the testbed's
    spectra (spectra.csv and their evolution plots), and summary.json. Ctrl-C stops after
    the current step and saves last.pt; continue with --resume RUN_DIR. With --resume, --set may change
    train and eval settings (e.g. train.max_steps to train longer), not the model or the data.
    """
    import os

    from upzoo.recipe import load_recipe
    from upzoo.runtime import resolve_device
    from upzoo.train.distributed import check_nproc, distributed_environment
    from upzoo.train.resume import resume_recipe

    if recipe is None and resume_dir is None:
        raise UsageError("give a RECIPE to train, or --resume RUN_DIR to continue a run")
    if continue_ and (out_dir is None or resume_dir is not None):
        raise UsageError("--continue needs RECIPE and --out (the folder to continue), not --resume")
    _, world, _ = distributed_environment()  # torchrun's variables checked before any work
    if resume_dir is not None:
        loaded = resume_recipe(resume_dir, recipe, overrides)
        run_dir = resume_dir
    else:
        loaded = load_recipe(recipe, overrides)
        run_dir = out_dir or default_run_dir(recipe)
    if nproc > 1 and world == 1:
        check_nproc(nproc, resolve_device(loaded.train.device, "train.device"))
        args = ["train"] + ([recipe] if recipe else []) + [a for o in overrides for a in ("--set", o)]
        args += ["--resume", run_dir] if resume_dir else ["--out", run_dir]
        args += ["--continue"] if continue_ else []
        args += ["--no-progress"] if no_progress else []
        sys.exit(_launch_torchrun(nproc, args))
    from upzoo.train.engine import train

    resume = "auto" if continue_ else resume_dir is not None
    summary = train(loaded, run_dir, resume=resume, progress=not no_progress)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    click.echo(to_json(summary)) if as_json else _print_summary(summary, loaded)
    if summary["interrupted"]:
        click.echo(
            f"interrupted at step {summary['steps']}; continue with: upzoo train --resume {summary['run_dir']}",
            err=True,
        )
        sys.exit(130)


def _print_summary(summary: dict, recipe: Recipe) -> None:
    click.echo(f"run folder: {summary['run_dir']}")
    reused = " (finished before)" if summary.get("reused") else ""
    click.echo(f"steps: {summary['steps']} of {summary['total_steps']}{reused}")
    val = summary.get("val") or {}
    if "miou" in val:
        best = float(summary["best_miou"]) if summary.get("best_miou") is not None else float("nan")
        click.echo(
            f"val mIoU: {float(val['miou']):.4f}  pixel accuracy: {float(val['pixel_accuracy']):.4f}  "
            f"mean Dice: {float(val['mean_dice']):.4f}  (best mIoU {best:.4f})"
        )
    if "swd" in summary or "checkerboard" in summary:
        click.echo(_generative_line(summary))
    line = _task_result_line(val)
    if line:
        click.echo(line)
    for note in _recipe_notes(recipe):
        click.echo(note)


def _recipe_notes(recipe: Recipe) -> list[str]:
    """What the result lines above depend on that they do not show: a perceptual term, the probe's baseline."""
    notes = []
    if recipe.task == "super_resolution" and recipe.train.perceptual_weight > 0:
        notes.append(
            f"trained with L1 + {recipe.train.perceptual_weight:g} x the perceptual term (L1 of ImageNet "
            f"EfficientNet-Lite0 features, a stand-in for VGG)"
        )
    if recipe.model.architecture == "linear_probe":
        options = recipe.model.options
        upsampler = options.get("upsampler_run") or options.get("upsampler", "interpolate")
        notes.append(
            f"a linear probe of {upsampler}; its baseline is the probe of bilinear upsampling, trained the same way "
            f"over seeds: upzoo bench compare RECIPE --upsamplers interpolate,... (bilinear first)"
        )
    return notes


def _task_result_line(val: dict) -> str | None:
    """The held-out result of a super-resolution, testbed or feature-upsampling run, beside its
    baseline where it has one (bicubic, bilinear): what the run folder's summary.json holds."""
    if "psnr_y" in val:
        gain = val["psnr_y"] - val["bicubic_psnr_y"]
        return (
            f"val PSNR Y: {val['psnr_y']:.2f} dB, SSIM Y {val['ssim_y']:.4f}  beside bicubic "
            f"{val['bicubic_psnr_y']:.2f} dB, SSIM Y {val['bicubic_ssim_y']:.4f}  "
            f"({gain:+.2f} dB; {val.get('images', '?')} held-out images)"
        )
    if "cosine_bilinear" in val:
        return (
            f"val cosine to the full images' features: {val['cosine']:.4f} beside bilinear "
            f"{val['cosine_bilinear']:.4f} ({val['cosine'] - val['cosine_bilinear']:+.4f}; mean over the ratios)"
        )
    if "cubic_psnr" in val:
        from upzoo.train.through_plane import best_interpolation

        best, value = best_interpolation(val, "psnr")
        return (
            f"val PSNR {val['psnr']:.4f} dB, SSIM {val['ssim']:.4f} in the brain beside linear "
            f"{val['linear_psnr']:.4f} dB, cubic {val['cubic_psnr']:.4f} dB, B-spline {val['bspline_psnr']:.4f} dB "
            f"({val['psnr'] - value:+.4f} dB against {best}, the best baseline; x{val['factor']} "
            f"through-plane, {val['block']})"
        )
    if "oracle_gm_dice" in val:
        return (
            f"val Dice {val['dice']:.4f} (grey matter {val['gm_dice']:.4f}, white matter {val['wm_dice']:.4f}, "
            f"CSF/other {val['csf_dice']:.4f}), grey-matter HD95 {val['gm_hd95']:.2f} mm; beside the label-free "
            f"k-means of the cubic-interpolated T1: Dice {val['kmeans_dice']:.4f} (grey matter "
            f"{val['kmeans_gm_dice']:.4f}, CSF/other {val['kmeans_csf_dice']:.4f}), and the oracle (each slab's "
            f"true majority label): Dice {val['oracle_dice']:.4f} (grey matter {val['oracle_gm_dice']:.4f}, HD95 "
            f"{val['oracle_gm_hd95']:.2f} mm); x{val['factor']} thick slices, {val['block']}"
        )
    if "spectral_error_corners" in val and "psnr" in val:
        return (
            f"val PSNR {val['psnr']:.2f} dB over {val.get('images', '?')} images; spectral error "
            f"{val['spectral_error']:.3f} (0.25-0.5 cycles/pixel), {val['spectral_error_corners']:.3f} (corners)"
        )
    return None


def _kid_text(result: dict) -> str:
    """KID with its spread over subsets; none where every subset was the whole set (one value)."""
    spread = result.get("kid_std", 0.0)
    return (
        f"KID {result['kid']:.4f} ± {spread:.4f}" if spread > 0 else f"KID {result['kid']:.4f} (one subset: all images)"
    )


def _upscaler_table(result: dict) -> str:
    """Per image and mean: the network's PSNR/SSIM (Y) beside bicubic interpolation's."""
    from upzoo.tables import render_table

    columns = {"psnr_y": "PSNR Y", "ssim_y": "SSIM Y", "psnr_rgb": "PSNR RGB", "spectral_error": "spectral err",
               "checkerboard": "checkerboard"}  # fmt: skip
    rows = [
        {
            "image": r["image"],
            **{t: r[k] for k, t in columns.items()},
            "bicubic PSNR Y": r["bicubic_psnr_y"],
            "bicubic SSIM Y": r["bicubic_ssim_y"],
        }
        for r in result["per_image"]
    ]
    rows.append({"image": "mean", **{t: result[k] for k, t in columns.items()},
                 "bicubic PSNR Y": result["bicubic_psnr_y"], "bicubic SSIM Y": result["bicubic_ssim_y"]})  # fmt: skip
    table = render_table(rows, list(rows[0]))
    scale = result["scale"]
    return (f"{table}\n\nx{scale}: PSNR/SSIM on Y (BT.601) with {scale} border pixels cropped, on 8-bit outputs; "
            f"{result['images']} images")  # fmt: skip


def _feature_table(result: dict) -> str:
    """Per ratio: the upsampler's cosine similarity to the full images' features beside bilinear's."""
    from upzoo.tables import render_table

    rows = [{"ratio": f"x{r}", "cosine": v["cosine"], "bilinear cosine": v["cosine_bilinear"], "loss": v["loss"]}
            for r, v in result["per_ratio"].items()]  # fmt: skip
    rows.append({"ratio": "mean", "cosine": result["cosine"], "bilinear cosine": result["cosine_bilinear"],
                 "loss": result["loss"]})  # fmt: skip
    return (f"{render_table(rows, list(rows[0]))}\n\nfeatures of images pooled by the ratio, upsampled back to the "
            f"full images' feature grid; {result['images']} images")  # fmt: skip


def _testbed_line(result: dict) -> str:
    """A testbed generator's regression on one line."""
    return (
        f"PSNR {result['psnr']:.2f} dB  spectral error {result['spectral_error']:.3f} (0.25-0.5 cycles/pixel)  "
        f"corner error {result['spectral_error_corners']:.3f} ({result['images']} images, step {result['step']})"
    )


def _generative_line(result: dict) -> str:
    """A generator's metrics on one line (what is there: SWD needs 16x16 images, KID/FD features)."""
    parts = [f"SWD {result['swd']:.2f}" if "swd" in result else "",
             f"spectral error {result['spectral_error']:.3f}" if "spectral_error" in result else "",
             _kid_text(result) if "kid" in result else "",
             f"{result['fd_name']} {result['fd']:.3f}" if "fd" in result else "",
             f"checkerboard {result['checkerboard']:.4f}" if "checkerboard" in result else ""]  # fmt: skip
    images = f" ({result['images']} generated vs {result['images']} real images)" if "images" in result else ""
    notes = "".join(f"; {result[k]}" for k in ("kid_fd", "swd_note") if isinstance(result.get(k), str))
    return "  ".join(p for p in parts if p) + images + notes


@cli.command("eval")
@click.argument("target", metavar="RUN_DIR_OR_RECIPE", type=click.Path(exists=True))
@click.option(
    "--checkpoint",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="A last.pt or best.pt of a run of RECIPE [default with a run folder: its best.pt, else last.pt].",
)
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a recipe value.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (per-class values keyed by class).")
def eval_command(target: str, checkpoint: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Evaluate a run (a run folder: its recipe.yaml and best.pt, else last.pt) or a --checkpoint of
    RECIPE. Segmentation, on the validation split: per-class IoU and Dice, with Boundary IoU and the
    boundary F-score (2D, 2 px) or HD95 and surface Dice (3D, 2 mm); their means and the pixel accuracy.
    GANs: eval.gan_images generated images against as many held-out real ones: SWD, spectral error,
    checkerboard, KID and the Fréchet distance on eval.features (auto: EfficientNet-Lite0 where
    upzoo[pretrained] is installed; or a run, an Inception weights file, null).
    Super-resolution: every held-out image whole, PSNR/SSIM on Y (border of scale pixels cropped),
    RGB PSNR, spectral error and checkerboard beside bicubic's, per image and the mean (e.g. --set
    data.kind=package_images for the photographs that ship with installed packages). Feature
    upsamplers: the cosine similarity per ratio beside bilinear's. The generator testbed: PSNR and
    the spectral errors of the images it regresses."""
    from upzoo.eval import evaluate_checkpoint
    from upzoo.recipe import load_recipe
    from upzoo.runs.trained_model import find_checkpoint

    if Path(target).is_dir():
        recipe = load_recipe(Path(target) / "recipe.yaml", overrides)
        checkpoint = checkpoint or str(find_checkpoint(target))
    elif checkpoint is None:
        raise click.UsageError("evaluating a RECIPE needs --checkpoint (or pass a run folder instead)")
    else:
        recipe = load_recipe(target, overrides)
    result = evaluate_checkpoint(recipe, checkpoint)
    render = {"gan": _generative_line, "super_resolution": _upscaler_table, "feature_upsampling": _feature_table,
              "generator_testbed": _testbed_line, "through_plane_sr": _task_result_line,
              "through_plane_segmentation": _tissue_table}.get(
                  recipe.task, _segmentation_table)  # fmt: skip
    if as_json:
        from upzoo.train.tasks import by_class_name

        names = result.get("class_names") or []  # per-class values keyed by class (segmentation)
        result = {k: by_class_name(v, names) if k.startswith("per_class_") else v for k, v in result.items()}
    click.echo(to_json(result) if as_json else render(result))


def _tissue_table(result: dict) -> str:
    """Per tissue: the network's Dice, HD95 and surface Dice, the label-free k-means' and the oracle's
    Dice; then the run's result line."""
    from upzoo.tables import render_table

    tissues = (("csf_", "CSF/other"), ("gm_", "grey matter"), ("wm_", "white matter"), ("", "mean"))
    rows = [{"tissue": name, "Dice": result[f"{p}dice"], "HD95 (mm)": result[f"{p}hd95"],
             "surface Dice": result[f"{p}surface_dice"], "k-means Dice": result[f"kmeans_{p}dice"],
             "oracle Dice": result[f"oracle_{p}dice"]} for p, name in tissues]  # fmt: skip
    return f"{render_table(rows, list(rows[0]))}\n\n{_task_result_line(result)}"


def _segmentation_table(result: dict) -> str:
    """Per class: IoU, Dice and what the result has (Boundary IoU and F-score in 2D, HD95 and
    surface Dice in 3D), then the means."""
    from upzoo.tables import render_table

    extra_columns = {"boundary_iou": "Boundary IoU", "boundary_fscore": "Boundary F", "hd95": "HD95 (mm)",
                     "surface_dice": "surface Dice"}  # fmt: skip
    present = {key: title for key, title in extra_columns.items() if key in result}
    rows = []
    for i, name in enumerate(result["class_names"]):
        row = {"class": name, "IoU": result["per_class_iou"][i], "Dice": result["per_class_dice"][i]}
        row.update({title: result[f"per_class_{key}"][i] for key, title in present.items()})
        rows.append(row)
    extra = "".join(f"  {title} {result[key]:.4f}" for key, title in present.items())
    return (
        f"{render_table(rows, ['class', 'IoU', 'Dice', *present.values()])}\n\nmIoU {result['miou']:.4f}  pixel "
        f"accuracy {result['pixel_accuracy']:.4f}  mean Dice {result['mean_dice']:.4f}{extra}  ({result['samples']} "
        f"validation samples; NaN: a class absent from prediction and ground truth)"
    )
