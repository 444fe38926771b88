"""A local launcher's worker: a long-lived process that trains the cells it is sent, one after
another, in itself, so only its first cell pays for the interpreter's and PyTorch's start-up.

Protocol: one JSON line per cell on stdin (``recipe_file``, ``folder``, ``log``); one JSON line per
result on the worker's original stdout (``status``, ``seconds``, ``error``). While a cell trains,
file descriptors 1 and 2 point at the cell's log, so the log holds exactly what
``upzoo train ... --continue`` would print. A cell is trained as that command trains it:
``resume="auto"``.

    python -m upzoo.bench.worker
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, TextIO

__all__ = ["main"]


def _train_cell(cell: dict[str, Any]) -> dict[str, Any]:
    from upzoo.errors import UpzooError
    from upzoo.recipe import load_recipe
    from upzoo.tables import to_json
    from upzoo.train.engine import train

    start = time.perf_counter()
    try:
        summary = train(load_recipe(cell["recipe_file"]), cell["folder"], resume="auto", progress=False)
    except UpzooError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return {"status": "failed", "seconds": time.perf_counter() - start, "error": f"error: {exc}"}
    except Exception as exc:  # a bug: the traceback goes to the cell's log, one line to the launcher
        traceback.print_exc()
        return {"status": "failed", "seconds": time.perf_counter() - start, "error": f"unexpected {exc!r}"}
    print(to_json(summary), flush=True)
    status = "failed" if summary.get("interrupted") else "done"
    return {
        "status": status,
        "seconds": time.perf_counter() - start,
        "error": "interrupted" if status != "done" else "",
    }


def _serve(requests: TextIO, replies: TextIO) -> None:
    for line in requests:
        cell = json.loads(line)
        log = os.open(cell["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        try:
            reply = _train_cell(cell)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol keeps the original stdout
    _serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
