"""A local launcher's worker: a long-lived process that trains the cells it is sent, one after
another, in itself, so only its first cell pays for the interpreter's and PyTorch's start-up.

Protocol: one JSON line per cell on stdin (the :class:`~upzoo.bench.plan.Cell`); one JSON line per
result on the worker's original stdout (``status``, ``seconds``, ``error``). Each cell is trained by
:func:`upzoo.bench.cells.train_cell`, as an in-process launch trains it: its output in its log.

    python -m upzoo.bench.worker
"""

from __future__ import annotations

import json
import os
import sys
from typing import TextIO

__all__ = ["main"]


def _serve(requests: TextIO, replies: TextIO) -> None:
    from upzoo.bench.cells import train_cell
    from upzoo.bench.plan import Cell

    for line in requests:
        result = train_cell(Cell(**json.loads(line)))
        status = "failed" if result.status == "interrupted" else result.status  # a worker's launch goes on
        replies.write(json.dumps({"status": status, "seconds": result.seconds, "error": result.error}) + "\n")
        replies.flush()


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol keeps the original stdout
    _serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
