"""The ``upzoo`` click group and ``upzoo list``."""

from __future__ import annotations

import click

from upzoo.errors import UpzooError
from upzoo.tables import to_json

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True}


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="upzoo")
def cli() -> None:
    """upzoo: pluggable upsamplers for U-Nets and GANs, with shape, speed and artifact tools."""


@cli.command("list")
@click.argument("pattern", default="*")
@click.option("--kind", type=click.Choice(["upsampler", "post_filter"]), default=None, help="Only this kind.")
@click.option(
    "--decoders", is_flag=True, help="The upsampling points of the smp_* decoders and the blocks each point takes."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_command(pattern: str, kind: str | None, decoders: bool, as_json: bool) -> None:
    """List the registered blocks whose names match PATTERN (or, with --decoders, the decoders'
    upsampling points).

    PATTERN takes shell wildcards, for example '*shuffle*'.
    """
    from upzoo.registry import list_upsamplers
    from upzoo.tables import render_table
    from upzoo.upsamplers.catalog import describe_blocks

    if decoders:
        from upzoo.models.smp_decoders import decoder_point_rows

        rows = decoder_point_rows()
        click.echo(to_json(rows) if as_json else render_table(rows, list(rows[0])))
        return
    rows = describe_blocks(pattern, kind=kind)
    if not rows:
        raise UpzooError(f"no block matches {pattern!r}; registered: {', '.join(list_upsamplers())}")
    if as_json:
        click.echo(to_json(rows))
        return
    click.echo(render_table(rows, ["name", "kind", "dims", "guide", "style", "params", "description"]))
    click.echo(
        "params: learned parameters at 64 -> 64 channels, scale 2, 2D (3D where 2D is not supported); "
        "guide: the block takes a guide at the output resolution: the encoder skip (fade, sapa; 64 channels "
        "here) or the image itself (jbu, jafar, loftup, anyup; 3 channels); style: the block takes a style vector "
        "as block(x, style) (modulated; 512 wide here, StyleGAN2's w)",
        err=True,
    )
    if any(row["name"] == "masked_blur" for row in rows):
        from upzoo.filters.masked_blur import FUSED_CPU_KERNEL

        click.echo(
            "masked_blur on the CPU: "
            + (
                "fused C kernel (built at install)"
                if FUSED_CPU_KERNEL
                else "PyTorch formulation (the fused kernel was not built at install: no C compiler, "
                "or its build failed;"
                " `pip install -v -e .` shows why)"
            ),
            err=True,
        )
