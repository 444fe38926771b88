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
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_command(pattern: str, kind: str | None, as_json: bool) -> None:
    """List the registered blocks whose names match PATTERN.

    PATTERN takes shell wildcards, for example '*shuffle*'.
    """
    from upzoo.registry import list_upsamplers
    from upzoo.upsamplers.catalog import describe_blocks

    rows = describe_blocks(pattern, kind=kind)
    if not rows:
        raise UpzooError(f"no block matches {pattern!r}; registered: {', '.join(list_upsamplers())}")
    if as_json:
        click.echo(to_json(rows))
        return
    from upzoo.tables import render_table

    click.echo(render_table(rows, ["name", "kind", "dims", "guide", "params", "description"]))
    click.echo(
        "params: learned parameters at 64 -> 64 channels, scale 2, 2D (3D where 2D is not supported); "
        "guide: the block takes the encoder skip as a guide (64 channels here)",
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
