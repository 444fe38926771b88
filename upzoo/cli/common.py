"""Parsing and loading helpers shared by the commands."""

from __future__ import annotations

import click

from upzoo.errors import UsageError


def parse_shape(text: str, what: str = "shape") -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{what} must look like 1x3x512x1024 (positive ints joined by 'x'), got {text!r}")
    return values


def parse_scale(text: str) -> int | tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"--scale must be an int or comma-separated ints like 1,2,2, got {text!r}") from None
    return values[0] if len(values) == 1 else values


def parse_options(pairs: tuple[str, ...]) -> dict:
    """``-o key=value`` pairs, each value parsed as YAML."""
    from upzoo.yaml_files import parse_yaml

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"options are key=value, got {pair!r}")
        options[key] = parse_yaml(value, f"-o {pair!r}")
    return options


def load_meta_model(recipe: str):
    """Build the recipe's model on the meta device (no memory, no weights); ``strides: auto`` is
    planned by :func:`~upzoo.prepare.resolve_model` (the synthetic spacing, or the first volume's)."""
    import torch

    from upzoo.models import build_model
    from upzoo.prepare import resolve_model
    from upzoo.recipe import load_recipe

    spec = resolve_model(load_recipe(recipe))
    with torch.device("meta"):
        return build_model(spec)


def check_device(device: str, *, auto: bool = False) -> str:
    """A ``--device`` value checked (usage error, exit 2) and resolved: ``cpu``, ``cuda[:N]``, ``auto``."""
    from upzoo.errors import ConfigError
    from upzoo.runtime import resolve_device

    if device == "auto" and not auto:
        raise UsageError("--device must be cpu or cuda, got 'auto'")
    try:
        return str(resolve_device(device, "--device"))
    except ConfigError as exc:
        raise UsageError(
            str(exc).replace("'auto', 'cpu', 'cuda' or 'cuda:N'", "cpu or cuda" if not auto else "cpu, cuda or auto")
        ) from None


def emit_rows(rows: list[dict], columns: list[str], as_json: bool, as_csv: bool) -> None:
    from upzoo.tables import render_table

    click.echo(render_table(rows, columns, "json" if as_json else "csv" if as_csv else "markdown"))


def default_run_dir(recipe: str | None) -> str:
    import time
    from pathlib import Path

    stem = Path(recipe).stem if recipe else "run"
    return str(Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")
