"""``upzoo shapes``: output shapes, per-layer traces, valid input sizes, transposed-conv parameters."""

from __future__ import annotations

import click

from upzoo.cli.common import load_meta_model, parse_options, parse_scale, parse_shape
from upzoo.cli.group import CONTEXT, cli
from upzoo.errors import UpzooError, UsageError
from upzoo.tables import to_json


@cli.group(context_settings=CONTEXT)
def shapes() -> None:
    """Output shapes, per-layer traces and valid input sizes, computed without running a model."""


@shapes.command("block")
@click.argument("name")
@click.option("--input", "input_shape", required=True, help="Input shape, e.g. 1x32x16x33x47.")
@click.option("--scale", default="2", help="Int or per-axis, e.g. 1,2,2.")
@click.option(
    "--out-channels", type=click.IntRange(min=1), default=None, help="Output channels [default: the input's]."
)
@click.option("-o", "--option", "options", multiple=True, help="Block option key=value (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def shapes_block(
    name: str, input_shape: str, scale: str, out_channels: int | None, options: tuple[str, ...], as_json: bool
) -> None:
    """Output shape of registered block NAME for an input shape (analytic, no forward pass, and the
    block is built on the meta device: no memory for its weights)."""
    import torch

    from upzoo.registry import create_upsampler, upsampler_info

    shape = parse_shape(input_shape, "--input")
    if len(shape) < 3:
        raise UsageError(f"--input needs (B, C, *spatial), got {input_shape!r}")
    info = upsampler_info(name)
    with torch.device("meta"):
        block = create_upsampler(
            name,
            spatial_dims=len(shape) - 2,
            in_channels=shape[1],
            out_channels=out_channels or shape[1],
            scale=1 if info.kind == "post_filter" else parse_scale(scale),
            **parse_options(options),
        )
    out = block.output_shape(shape)
    if as_json:
        click.echo(to_json({"block": name, "input": shape, "output": out, "scale": block.scale}))
    else:
        from upzoo.layers import format_shape

        click.echo(f"{name}: {format_shape(shape)} -> {format_shape(out)} (scale {'x'.join(map(str, block.scale))})")


@shapes.command("model")
@click.argument("recipe", type=click.Path(exists=True, dir_okay=False))
@click.option("--input", "input_shape", required=True, help="Input shape, e.g. 1x3x512x1024.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def shapes_model(recipe: str, input_shape: str, as_json: bool) -> None:
    """Per-layer table (layer, output shape, parameters) of RECIPE's model on the meta device.

    A U-Net pads an input of an invalid size to the next valid one (input_policy 'pad'): its layers
    run at the padded size, and the output is cropped back to the input size; both are stated."""
    import torch

    from upzoo.layers import format_shape
    from upzoo.shapes import trace
    from upzoo.tables import render_table

    model, shape = load_meta_model(recipe), parse_shape(input_shape, "--input")
    rows = trace(model, shape)
    with torch.no_grad():
        output = tuple(model(torch.empty(shape, device="meta")).shape)
    padded = tuple(model.padded_size(shape[2:])) if hasattr(model, "padded_size") else tuple(shape[2:])
    padded_to = (*shape[:2], *padded) if padded != tuple(shape[2:]) else None
    table = [{"layer": r.name, "type": r.layer, "output": r.output_shape, "params": r.params} for r in rows]
    if as_json:
        click.echo(to_json({"input": shape, "padded_to": padded_to, "output": output, "layers": table}))
        return
    click.echo(render_table(table, ["layer", "type", "output", "params"]))
    total = sum(r.params for r in rows)
    click.echo(f"{len(rows)} layers, {total:,} parameters in the traced layers", err=True)
    if padded_to is not None:
        click.echo(
            f"input {format_shape(shape)} is not a valid size: the model pads it to {format_shape(padded_to)}, "
            f"the layers above run at that size, and the output is cropped back to {format_shape(output)}"
        )
    else:
        click.echo(f"output: {format_shape(output)}")


def _size_2d(size: str, dims: int = 2) -> tuple[int, ...]:
    spatial = parse_shape(size, "--size")
    if len(spatial) != dims:
        layout = "HxW for this 2D model" if dims == 2 else "DxHxW for this 3D model"
        raise UsageError(f"--size takes {dims} sizes {layout}, got {size!r}")
    return spatial


def _range(size_range: str | None) -> tuple[int, int]:
    low, _, high = str(size_range).partition(":")
    if not (low.isdigit() and high.isdigit()) or int(low) > int(high):
        raise UsageError(f"--range must look like 256:2048, got {size_range!r}")
    return int(low), int(high)


def _super_resolution_check(model, size: str | None, size_range: str | None, as_json: bool) -> None:
    """A super-resolution network (2D, or 3D with a per-axis scale): fully convolutional, so every
    size is valid; the output is scaled."""
    scales = model.scale if isinstance(model.scale, tuple) else (model.scale,) * 2
    rules = [f"every size >= 1 (fully convolutional); the output is the input x {s}" for s in scales]
    per_axis = f"x {' x '.join(map(str, scales))} per axis (D, H, W)" if len(scales) == 3 else ""
    rule = (
        rules[0]
        if len(set(rules)) == 1
        else f"every size >= 1 (fully convolutional); the output is the input {per_axis}"
    )
    result: dict = {"rules": rules}
    if size is not None:
        result["output"] = list(model.output_shape((1, model.in_channels, *_size_2d(size, len(scales))))[2:])
    else:
        low, high = _range(size_range)
        result["valid"] = f"every size in {low}..{high}"
    if as_json:
        click.echo(to_json(result))
        return
    click.echo(f"rule: {rule}")
    if size is not None:
        click.echo(f"{size}: valid, output {'x'.join(map(str, result['output']))}")
    else:
        click.echo(f"valid: {result['valid']}")


def _stride_check(model, size: str | None, size_range: str | None, as_json: bool) -> None:
    """A model on a frozen backbone: every side a multiple of the backbone's stride; the output
    at the input size."""
    from upzoo.models.sizes import AxisRule

    stride = model.size_multiple()[0]
    rule = AxisRule(multiple=stride, minimum=stride)
    text = f"{rule.describe()} (the backbone's stride); the output is at the input size"
    result: dict = {"rules": [text, text]}
    if size is not None:
        spatial = _size_2d(size)
        result["valid"] = all(rule.is_valid(n) for n in spatial)
        result["nearest_valid"] = (
            [max(rule.below(n) or stride, stride) for n in spatial],
            [rule.above(n) for n in spatial],
        )
    else:
        low, high = _range(size_range)
        result["valid"] = list(range(rule.above(low), high + 1, stride))
    if as_json:
        click.echo(to_json(result))
        return
    click.echo(f"rule: {text}")
    if size is None:
        click.echo(f"valid: {', '.join(map(str, result['valid'])) or 'none'}")
    elif result["valid"]:
        click.echo(f"{size}: valid")
    else:
        below, above = result["nearest_valid"]
        click.echo(f"{size}: not valid; nearest valid sizes {'x'.join(map(str, below))} or {'x'.join(map(str, above))}")


def _answered_without_solver(model, size: str | None, size_range: str | None, as_json: bool) -> bool:
    """Super-resolution networks (every size) and models on a frozen backbone (the stride) have
    their rule from their construction; answer for them and return True."""
    from upzoo.models import FeatureUpsampler, LinearProbe

    if hasattr(model, "scale") and hasattr(model, "output_shape") and not hasattr(model, "encoder"):
        _super_resolution_check(model, size, size_range, as_json)
        return True
    if isinstance(model, (FeatureUpsampler, LinearProbe)):
        _stride_check(model, size, size_range, as_json)
        return True
    return False


@shapes.command("check")
@click.argument("recipe", type=click.Path(exists=True, dir_okay=False))
@click.option("--size", default=None, help="Spatial size to check, e.g. 350x525.")
@click.option("--range", "size_range", default=None, help="List the valid sizes in LOW:HIGH on one axis.")
@click.option("--axis", type=click.IntRange(min=0), default=0, help="Axis for --range.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def shapes_check(recipe: str, size: str | None, size_range: str | None, axis: int, as_json: bool) -> None:
    """Which input sizes RECIPE's model accepts: the rule per axis, a size's verdict, or a range."""
    from upzoo.shapes import ShapeSolver

    if (size is None) == (size_range is None):
        raise UsageError("give exactly one of --size and --range")
    model = load_meta_model(recipe)
    if _answered_without_solver(model, size, size_range, as_json):
        return
    if not hasattr(model, "encoder"):
        raise UpzooError(
            f"{recipe}: shapes check answers for segmentation models with spatial inputs; "
            f"a {type(model).__name__} takes latent vectors (use shapes model --input BxLATENT)"
        )
    solver = ShapeSolver(model)
    rules = [solver.rule(a) for a in range(solver.spatial_dims)]
    policy = getattr(model, "input_policy", None)
    result: dict = {
        "path": solver.path,
        "reason": solver.reason or None,
        "input_policy": policy,
        "rules": [r.describe() if r else "irregular" for r in rules],
    }
    if size is not None:
        checks = solver.check(parse_shape(size, "--size"))
        result["axes"] = [
            {"axis": c.axis, "size": c.size, "valid": c.valid, "below": c.below, "above": c.above, "padding": c.padding}
            for c in checks
        ]
    else:
        low, _, high = size_range.partition(":")
        try:
            low_i, high_i = int(low), int(high)
        except ValueError:
            raise UsageError(f"--range must look like 256:2048, got {size_range!r}") from None
        if not axis < solver.spatial_dims:
            raise UsageError(f"--axis must be in 0..{solver.spatial_dims - 1} for this model, got {axis}")
        result["axis"], result["valid_sizes"] = axis, solver.valid_sizes(axis, low_i, high_i)
    if as_json:
        click.echo(to_json(result))
        return
    how = "analytic stride arithmetic" if solver.path == "analytic" else f"probing on the meta device ({solver.reason})"
    click.echo(f"path: {how}", err=True)
    for a, rule in enumerate(result["rules"]):
        click.echo(f"axis {a}: {rule}")
    if "axes" in result:
        for c in result["axes"]:
            verdict = (
                "valid"
                if c["valid"]
                else (f"invalid; nearest valid: {c['below']} below, {c['above']} above (pad {c['padding']})")
            )
            click.echo(f"size {c['size']} on axis {c['axis']}: {verdict}")
        if policy == "pad" and not all(c["valid"] for c in result["axes"]):
            click.echo("input_policy 'pad': the model pads such inputs to the sizes above and crops the output back")
    else:
        sizes = result["valid_sizes"]
        click.echo(f"{len(sizes)} valid sizes in {size_range} on axis {axis}: {' '.join(map(str, sizes))}")


@shapes.command("solve")
@click.option("--in", "in_size", type=click.IntRange(min=1), required=True, help="Input size on the axis.")
@click.option("--out", "out_size", type=click.IntRange(min=1), default=None, help="Wanted output size.")
@click.option("--scale", type=click.IntRange(min=1), default=None, help="Wanted scale instead of --out.")
@click.option("--stride", type=click.IntRange(min=1), required=True, help="Stride of the transposed conv.")
@click.option(
    "--max-kernel", type=click.IntRange(min=1), default=None, help="Largest kernel to consider [default: 2*stride+1]."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def shapes_solve(
    in_size: int, out_size: int | None, scale: int | None, stride: int, max_kernel: int | None, as_json: bool
) -> None:
    """Transposed-conv (kernel, padding, output_padding, dilation) reaching an exact output size."""
    from upzoo.shapes import solve_transposed
    from upzoo.tables import render_table

    solutions = solve_transposed(in_size, out_size, stride=stride, scale=scale, max_kernel=max_kernel)
    rows = [s.to_dict() for s in solutions]
    if as_json:
        click.echo(to_json(rows))
        return
    if not rows:
        raise UpzooError(
            f"no transposed conv with stride {stride} turns {in_size} into "
            f"{out_size or in_size * (scale or 1)}; try another stride or a larger --max-kernel"
        )
    for row in rows:
        row["checkerboard risk"] = "yes (uneven overlap)" if row.pop("uneven_overlap") else "no"
    click.echo(render_table(rows, ["kernel_size", "padding", "output_padding", "dilation", "checkerboard risk"]))
