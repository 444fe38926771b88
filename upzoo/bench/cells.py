"""One cell of a comparison run and what became of it: in this process (:func:`run_in_process`) or
as its ``upzoo train ... --continue`` command (:func:`run_subprocess`), its :class:`CellResult`, and
the one line that says why a cell failed (:func:`last_error`, :func:`exit_reason`). Every launcher
(local, worker, Slurm) runs cells through these, so a cell's log and its failure read the same
wherever it ran."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from upzoo.bench.plan import Cell
from upzoo.errors import UpzooError

__all__ = ["CellResult", "train_cell", "run_in_process", "run_subprocess", "report", "last_error", "exit_reason",
           "output_to"]  # fmt: skip


@dataclass
class CellResult:
    """How a cell ended: ``done`` (trained now or earlier), ``failed`` (with the error and its log) or
    ``interrupted`` (Ctrl-C; continued by the next launch)."""

    cell: Cell
    status: str
    seconds: float = 0.0
    error: str = ""
    attempts: int = 1


def last_error(log: str | Path) -> str:
    """The ``error:`` line of a cell's log (else its last line), to report a failure in one line."""
    try:
        lines = [line.strip() for line in Path(log).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["exited without output"])[-1]


def exit_reason(code: int, log: str | Path) -> str:
    """Why a cell's process ended with ``code``: the signal that killed it (a negative code, as
    ``subprocess`` reports it), with its log's last line where it left one; else :func:`last_error`.

    >>> exit_reason(-9, "/nonexistent.log")
    'killed by SIGKILL (no log)'
    """
    if code >= 0:
        return last_error(log)
    import signal

    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"killed by {name} ({last_error(log)})"


@contextlib.contextmanager
def output_to(log: str | Path) -> Iterator[None]:
    """What the cell prints, its warnings and tracebacks into ``log`` (truncated) for the duration:
    file descriptors 1 and 2 (output of C code and subprocesses) and ``sys.stdout``/``sys.stderr``
    (which need not write to them, e.g. under a test runner), all appending; restored afterwards."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    saved = os.dup(1), os.dup(2)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)
    try:
        with (
            open(log, "a", buffering=1) as stream,
            contextlib.redirect_stdout(stream),
            contextlib.redirect_stderr(stream),
        ):
            yield
    finally:
        for fd, original in zip((1, 2), saved):
            os.dup2(original, fd)
            os.close(original)


def train_cell(cell: Cell) -> CellResult:
    """Train ``cell`` in this process as its ``upzoo train ... --continue`` command would
    (``resume="auto"``), its output in its log, so the log reads the same wherever it ran: the run's
    summary as JSON, or the one ``error:`` line of an upzoo error, or the traceback of anything else
    (a bug fails its cell and the comparison goes on). ``interrupted`` when Ctrl-C or SIGTERM stopped
    it (its ``last.pt`` is written; the next launch continues it), or came while it finished."""
    import traceback

    from upzoo.recipe import load_recipe
    from upzoo.tables import to_json
    from upzoo.train.engine import train

    start = time.perf_counter()
    with output_to(cell.log):
        try:
            summary = train(load_recipe(cell.recipe_file), cell.folder, resume="auto", progress=False)
        except UpzooError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return CellResult(cell, "failed", time.perf_counter() - start, f"error: {exc}")
        except Exception as exc:  # noqa: BLE001 - a bug: kept whole in the log
            traceback.print_exc()
            print(f"error: unexpected {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return CellResult(cell, "failed", time.perf_counter() - start,
                              f"unexpected {type(exc).__name__}: {exc} (traceback in {cell.log})")  # fmt: skip
        print(to_json(summary), flush=True)
    # a stop asked for during the cell's last evaluation stops the launch too, the cell being finished
    status = "interrupted" if summary.get("interrupted") or summary.get("stop_requested") else "done"
    return CellResult(cell, status, time.perf_counter() - start, "interrupted" if status != "done" else "")


def run_in_process(cell: Cell) -> CellResult:
    """:func:`train_cell` in this process and thread, where Ctrl-C reaches its training loop: an
    interrupted cell stops the whole launch (``KeyboardInterrupt``), to be continued later."""
    result = train_cell(cell)
    if result.status == "interrupted":
        raise KeyboardInterrupt
    return result


def run_subprocess(cell: Cell, env: dict[str, str]) -> CellResult:
    from upzoo.bench.plan import python_command

    start = time.perf_counter()
    Path(cell.log).parent.mkdir(parents=True, exist_ok=True)
    with open(cell.log, "w") as log:
        code = subprocess.call(python_command(cell), stdout=log, stderr=subprocess.STDOUT, env=env)
    seconds = time.perf_counter() - start
    return (
        CellResult(cell, "done", seconds)
        if code == 0
        else CellResult(cell, "failed", seconds, exit_reason(code, cell.log))
    )


def report(result: CellResult, echo: Callable[[str], None]) -> None:
    cell = result.cell
    if result.status == "done":
        echo(f"done {cell.variant} seed {cell.seed} in {result.seconds:.1f} s")
    else:
        echo(f"failed {cell.variant} seed {cell.seed}: {result.error} (log: {cell.log})")
