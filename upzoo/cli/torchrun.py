"""``python -m upzoo.cli.torchrun ARGS``: torchrun (``torch.distributed.run``) as ``upzoo train
--nproc`` launches it, without the launcher's own traceback when a rank stops. Each rank prints its
one-line error itself; the launcher then adds one line naming the ranks that stopped and exits with
their code, where torchrun would print some 30 lines of ``ChildFailedError`` traceback."""

from __future__ import annotations

import logging
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv``; 0 when every rank finished, else the exit code of the first rank that
    stopped by itself (the launcher ends the others with SIGTERM, which they report as -15)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # the ranks say what went wrong
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except ChildFailedError as error:
        failed = sorted(error.failures)
        codes = [error.failures[rank].exitcode for rank in failed]
        code = next((code for code in codes if code > 0), codes[0])
        ranks = ("ranks " if len(failed) > 1 else "rank ") + ", ".join(str(rank) for rank in failed)
        print(f"upzoo train: {ranks} of the group stopped (exit code {code}); the message above says why",
              file=sys.stderr)  # fmt: skip
        return code if code > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
