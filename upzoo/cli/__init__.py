"""The ``upzoo`` command line: thin commands over the library. Data goes to stdout, messages to
stderr. Every error is one line on stderr: ``error: ...`` with exit code 1 for problems with the
input (an :class:`~upzoo.errors.UpzooError`), 2 for usage errors (unknown options, missing
arguments, files that do not exist), 130 for Ctrl-C. ``UPZOO_DEBUG=1`` shows the traceback of an
unexpected failure instead of its one-line summary."""

from __future__ import annotations

import os
import sys
import warnings

import click

from upzoo.cli import bench, device, predict_sample_export, recipe, shapes, train, upscale  # noqa: F401  (registers)
from upzoo.cli.group import cli
from upzoo.errors import UpzooError, UsageError, one_line

__all__ = ["cli", "main"]


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line naming what the user asked for, not the file that noticed."""
    click.echo(f"warning: {one_line(str(message))}", err=True)


MAX_MESSAGE = 1000  # characters; a huge bad value is not echoed back whole


def _fail(message: str, code: int) -> None:
    line = one_line(message)
    if len(line) > MAX_MESSAGE:
        line = f"{line[: MAX_MESSAGE - 200]} ... ({len(line) - MAX_MESSAGE + 200:,} characters cut) ... {line[-150:]}"
    click.echo(f"error: {line}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``upzoo`` console script."""
    warnings.showwarning = _show_warning
    try:
        cli.main(args=argv, prog_name="upzoo", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        where = f" (see '{exc.ctx.command_path} -h')" if exc.ctx is not None else ""
        _fail(exc.format_message() + where, 2)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code or 1)
    except UpzooError as exc:
        _fail(str(exc), 2 if isinstance(exc, UsageError) else 1)
    except OSError as exc:  # the disk or the system, not upzoo: full, read-only, permissions
        _fail(f"{exc.filename}: {exc.strerror or exc}" if exc.filename else f"system error: {exc}", 1)
    except MemoryError:
        _fail("out of memory: the input or model is too large for this machine; use a smaller size or batch", 1)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a traceback
        if os.environ.get("UPZOO_DEBUG"):
            raise
        _fail(f"unexpected {type(exc).__name__}: {exc} (a bug in upzoo; UPZOO_DEBUG=1 shows the traceback)", 1)
