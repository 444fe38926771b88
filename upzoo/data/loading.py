"""Iterating a DataLoader so that an upzoo error raised in a worker process stays the one line it
was: PyTorch re-raises a worker's exception in the main process as the same type, with the whole
worker traceback ("Caught DataError in DataLoader worker process 0 ...") as its message."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from upzoo.errors import UpzooError

__all__ = ["iterate_loader", "unwrap_worker_error"]

T = TypeVar("T")


def unwrap_worker_error(exc: UpzooError) -> UpzooError:
    """The worker's own error (its message is the traceback's last line), or ``exc`` itself.

    >>> from upzoo.errors import DataError
    >>> wrapped = DataError("Caught DataError in DataLoader worker process 0.\\nOriginal Traceback (most recent "
    ...                     "call last):\\n  ...\\nupzoo.errors.DataError: a.png: unreadable image\\n")
    >>> str(unwrap_worker_error(wrapped))
    'a.png: unreadable image'
    """
    text = str(exc)
    if not text.startswith("Caught ") or "Original Traceback" not in text:
        return exc
    last = [line for line in text.splitlines() if line.strip()][-1]
    name, sep, message = last.partition(": ")
    return type(exc)(message if sep and name.endswith(type(exc).__name__) else last)


def iterate_loader(loader: Iterable[T]) -> Iterator[T]:
    """Yield ``loader``'s batches; an upzoo error from a worker is re-raised as its own one line, and
    the workers are stopped at once (left to garbage collection, PyTorch waits up to 5 s per worker
    blocked on a full result pipe)."""
    iterator = iter(loader)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except UpzooError as exc:
            _stop_workers(iterator)
            raise unwrap_worker_error(exc) from None
        yield batch


def _stop_workers(iterator: object) -> None:
    """Terminate a multi-process DataLoader iterator's workers (no-op for single-process loading)."""
    for worker in getattr(iterator, "_workers", ()):
        if worker.is_alive():
            worker.terminate()
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
