"""``upzoo predict``, ``upzoo sample`` and ``upzoo export``: using a trained model."""

from __future__ import annotations

import time
from pathlib import Path

import click

from upzoo.cli.common import check_device
from upzoo.cli.group import cli
from upzoo.errors import UpzooError, UsageError
from upzoo.tables import to_json

RUN = click.argument("run", metavar="RUN_DIR_OR_CHECKPOINT", type=click.Path(exists=True))


def _device(device: str) -> str:
    return check_device(device, auto=True)


def _scales(text: str) -> tuple[float, ...]:
    try:
        scales = tuple(float(s) for s in text.split(","))
    except ValueError:
        scales = ()
    if not scales or not all(0.125 <= s <= 8 for s in scales):
        raise UsageError(f"--scales takes numbers in [0.125, 8] separated by commas, e.g. 0.75,1,1.25; got {text!r}")
    return scales


def _check_inputs_exist(inputs: tuple[str, ...]) -> None:
    """A named input that is neither a file, a folder nor a glob pattern is a usage error."""
    for item in inputs:
        if not any(c in item for c in "*?[") and not Path(item).exists():
            raise UsageError(f"input {item!r} does not exist (give files, folders, globs or a dataset.json)")


@cli.command("predict")
@RUN
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for the outputs.")
@click.option("--tta", type=click.Choice(["none", "flip"]), default="none", help="Average with the mirrored input.")
@click.option("--scales", default="1", help="2D: scales to average over, e.g. 0.75,1,1.25.")
@click.option(
    "--window",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    help="Sliding window of the training crop: auto = for inputs larger than it.",
)
@click.option("--overlay", is_flag=True, help="2D: also write the image with the class colours blended in.")
@click.option(
    "--probabilities",
    type=click.Choice(["nifti", "npz"]),
    default=None,
    help="Also write class probabilities: 4D float32 NIfTI (volumes) or float16 .npz.",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=4, help="2D images per forward pass.")
@click.option("--workers", type=click.IntRange(min=0), default=2, help="DataLoader workers reading the inputs.")
@click.option("--amp", is_flag=True, help="bf16 autocast.")
@click.option(
    "--backend",
    type=click.Choice(["eager", "onnxruntime", "openvino", "compile"]),
    default="eager",
    help="What runs the model: PyTorch, the verified ONNX export in onnxruntime, the verified OpenVINO IR, or "
    "torch.compile.",
)
@click.option(
    "--precision",
    type=click.Choice(["f32", "bf16"]),
    default="f32",
    help="openvino: float32, or bf16 where the CPU has bf16 hardware (never OpenVINO's silent default).",
)
@click.option("--onnx", "onnx_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="onnxruntime: this export of the run [default: export it now].")  # fmt: skip
@click.option("--tile", type=click.IntRange(min=1), default=None,
              help="Super-resolution: upscale in overlapping tiles of this many input pixels "
              "(the same result as whole).")  # fmt: skip
@click.option("--no-resample", is_flag=True,
              help="Volumes: run at their own voxel grid instead of resampling to the training spacing.")  # fmt: skip
@click.option("--device", default="auto", help="cpu, cuda or auto.")
@click.option("--keep-going", is_flag=True, help="Skip unreadable or wrongly shaped inputs; list them at the end.")
@click.option("--overwrite", is_flag=True, help="Replace outputs that already exist.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def predict_command(run, inputs, out_dir, tta, scales, window, overlay, probabilities, batch_size, workers, amp,
                    backend, precision, onnx_path, tile, no_resample, device, keep_going, overwrite, no_progress,
                    as_json) -> None:  # fmt: skip
    """Predict with a trained run on INPUT... (images, NIfTI volumes, folders, globs or a decathlon
    dataset.json), what its task makes: a segmentation run (its best.pt, else last.pt, or a
    checkpoint) segments; a super-resolution run upscales images to NAME.png at the input's bit
    depth (8 or 16), whole or with --tile; a through-plane run upsamples the slices of thick-slice
    NIfTI volumes to NAME.nii.gz on the thin grid (its affine: thinner voxels along the slice axis,
    the same place in scanner space), or, trained for segmentation, writes their tissue labels
    (uint8) on that grid.

    2D: writes NAME.png (train ids, uint8), color/NAME.png (the dataset's palette) and with --overlay
    overlay/NAME.png. 3D: each volume is resampled to the training spacing, predicted, and its
    logits resampled back, so NAME.nii.gz holds uint8 labels in the source's grid (same shape,
    affine and header); --no-resample skips that. Always predictions.csv (file, shape, seconds,
    classes present).
    """
    from upzoo.inference import Predictor, load_model
    from upzoo.inference.run import PredictOptions, predict_files

    _check_inputs_exist(inputs)
    device = _device(device if backend not in ("onnxruntime", "openvino") or device != "auto" else "cpu")
    loaded = load_model(run, device=device)
    if loaded.task in ("super_resolution", "through_plane_sr", "through_plane_segmentation"):
        given = {"--tta": tta != "none", "--scales": scales != "1", "--window": window != "auto", "--overlay": overlay,
                 "--probabilities": probabilities, "--backend": backend != "eager", "--onnx": onnx_path,
                 "--precision": precision != "f32",
                 "--no-resample": no_resample, "--batch-size": batch_size != 4, "--workers": workers != 2}  # fmt: skip
        # (the options above are read by image and volume segmentation only)
        if loaded.task == "super_resolution":
            _upscale(loaded, inputs, out_dir, tile, device, amp, overwrite, keep_going, no_progress, as_json, given)
        else:
            given["--tile"] = tile is not None
            _upsample_slices(loaded, inputs, out_dir, device, amp, overwrite, keep_going, no_progress, as_json, given)
        return
    if tile is not None:
        raise UsageError("--tile is for super-resolution runs; a segmentation run slides its window (--window)")
    if probabilities == "nifti" and not loaded.volumes:
        raise UsageError("--probabilities nifti is for volumes; use --probabilities npz for images")
    started = time.perf_counter()  # the backend's set-up: an onnxruntime export is verified here
    predictor = Predictor(loaded, device=device, amp=amp, tta=tta, scales=_scales(scales), window=window,
                          probabilities=bool(probabilities), backend=backend, onnx_path=onnx_path,
                          resample=not no_resample, precision=precision)  # fmt: skip
    options = PredictOptions(Path(out_dir), overlay, probabilities, batch_size, workers, keep_going, overwrite,
                             not no_progress)  # fmt: skip
    setup = time.perf_counter() - started
    summary = predict_files(predictor, inputs, options)
    exported = backend == "openvino" or (backend == "onnxruntime" and onnx_path is None)
    if as_json:
        click.echo(to_json(summary | ({"export_seconds": round(setup, 3)} if exported else {})))
    else:
        skip = "" if backend == "openvino" else " (pass --onnx with a file from upzoo export to skip it)"
        fmt = "OpenVINO IR" if backend == "openvino" else "ONNX"
        took = f"; before that, exporting the model to {fmt} and verifying it took {setup:.1f} s{skip}"
        export = took if exported else ""
        click.echo(f"wrote {summary['written']} predictions to {out_dir} in {summary['seconds']:.1f} s "
                   f"({summary['csv']}){export}")  # fmt: skip
    _report_failed(summary)


def _report_failed(summary: dict) -> None:
    """Each skipped input on stderr, then one error for all of them (exit code 1)."""
    for _, message in summary["failed"]:
        click.echo(f"skipped: {message}", err=True)
    if summary["failed"]:
        raise UpzooError(f"{len(summary['failed'])} of {len(summary['failed']) + summary['written']} inputs failed")


def _upscale(loaded, inputs, out_dir, tile, device, amp, overwrite, keep_going, no_progress, as_json, given) -> None:
    """``upzoo predict`` on a super-resolution run."""
    from upzoo.inference.file_upscaling import upscale_files

    for option, used in given.items():
        if used:
            raise UsageError(
                f"{option} is for segmentation runs; {loaded.checkpoint} is a super-resolution run (it upscales one "
                f"image at a time, whole or with --tile)"
            )
    summary = upscale_files(loaded, inputs, Path(out_dir), tile=tile, device=device, amp=amp, overwrite=overwrite,
                            keep_going=keep_going, progress=not no_progress)  # fmt: skip
    if as_json:
        click.echo(to_json(summary))
    else:
        how = f"in tiles of {summary['tile']} (halo {summary['halo']})" if summary["tile"] else "whole"
        click.echo(f"upscaled {summary['written']} images {how} into {out_dir} in {summary['seconds']:.1f} s")
    _report_failed(summary)


def _upsample_slices(loaded, inputs, out_dir, device, amp, overwrite, keep_going, no_progress, as_json, given) -> None:
    """``upzoo predict`` on a through-plane run (super-resolution, or segmentation on the thin grid)."""
    from upzoo.inference.slice_upscaling import upscale_volume_files

    for option, used in given.items():
        if used:
            raise UsageError(f"{option} is not read by a through-plane run ({loaded.checkpoint}: it takes each "
                             f"volume whole)")  # fmt: skip
    summary = upscale_volume_files(loaded, inputs, Path(out_dir), device=device, amp=amp, overwrite=overwrite,
                                   keep_going=keep_going, progress=not no_progress)  # fmt: skip
    if as_json:
        click.echo(to_json(summary))
    else:
        what = "labelled on the thin grid" if loaded.task == "through_plane_segmentation" else "upsampled the slices of"
        click.echo(f"{what} {summary['written']} volumes into {out_dir} in {summary['seconds']:.1f} s")
    _report_failed(summary)


@cli.command("sample")
@RUN
@click.option("--num", type=click.IntRange(min=1, max=100000), default=64, help="How many images.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for the PNGs.")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=0, help="Seed of the latents.")
@click.option("--device", default="auto", help="cpu, cuda or auto.")
@click.option("--overwrite", is_flag=True, help="Replace images that already exist.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def sample_command(run, num, out_dir, seed, device, overwrite, as_json) -> None:
    """Draw NUM images from the generator of a GAN run (with its post-filter, as in training):
    sample_0000.png ... and grid.png."""
    from upzoo.inference import load_model
    from upzoo.inference.sampling import sample_images

    summary = sample_images(load_model(run, device=_device(device)), num, Path(out_dir), seed=seed, overwrite=overwrite)
    click.echo(to_json(summary) if as_json else f"wrote {num} samples and {summary['grid']}")


@cli.command("export")
@RUN
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["onnx", "exported-program", "openvino"]),
    default="onnx",
    help="What to write (openvino: IR .xml + .bin, float32 weights).",
)
@click.option(
    "--out", "out_file", default=None, type=click.Path(dir_okay=False), help="[default: RUN/model.onnx|.pt2|.xml]"
)
@click.option("--opset", type=click.IntRange(min=18, max=23), default=None, help="ONNX opset [default: exporter's].")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out file (never a checkpoint).")
@click.option("--portable", is_flag=True, help="A .pt2 without upzoo's custom ops (loads without import upzoo).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def export_command(run, fmt, out_file, opset, overwrite, portable, as_json) -> None:
    """Export a trained model with dynamic batch and spatial sizes (generators: the batch), verified:
    the written file runs at three sizes (one off the model's size grid) and must match PyTorch
    within 1e-4, else nothing is written and the block that fails is named. --format openvino writes
    OpenVINO IR (.xml + .bin, converted from the ONNX export, float32 weights) verified with OpenVINO's
    CPU plugin set to float32 (its default there is bfloat16 on CPUs with bf16 hardware)."""
    from upzoo.inference import load_model
    from upzoo.inference.export import export_model

    report = export_model(load_model(run), fmt, out_file, opset=opset, overwrite=overwrite, portable=portable)
    if as_json:
        click.echo(to_json(report))
        return
    for check in report["checks"]:
        click.echo(f"verified at input {check['input']}: max |export - PyTorch| = {check['max_abs_diff']:.2e}")
    click.echo(f"wrote {report['path']} ({report['bytes'] / 1e6:.1f} MB, {report['format']}) with its contract:")
    for key, value in report["contract"].items():
        click.echo(f"  {key}: {value}")
    if report["custom_ops"]:
        click.echo(
            f"note: the program calls {', '.join(report['custom_ops'])}: load it after 'import upzoo', "
            f"or export again with --portable",
            err=True,
        )
