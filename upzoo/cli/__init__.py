"""The ``upzoo`` command line: thin commands over the library. Data goes to stdout, messages to
stderr; an :class:`~upzoo.errors.UpzooError` becomes one line and exit code 1."""

from __future__ import annotations

import sys

import click

from upzoo.cli import bench, shapes, train  # noqa: F401  (registers the commands)
from upzoo.cli.group import cli
from upzoo.errors import UpzooError

__all__ = ["cli", "main"]


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
