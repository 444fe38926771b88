"""Stopping at a step boundary on Ctrl-C or SIGTERM (:class:`StopFlag`), and SIGTERM ending a
command as Ctrl-C does (:class:`terminate_as_interrupt`)."""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["StopFlag", "terminate_as_interrupt"]


class StopFlag:
    """Turns the first Ctrl-C (SIGINT) or SIGTERM into a request to stop after the current step;
    a second Ctrl-C interrupts at once. Checkpoints are atomic, so the last one stays intact."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def request(self) -> None:
        self.requested = True

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        import sys

        print(
            f"\nupzoo: {signal.Signals(signum).name} received: stopping after this step and saving a checkpoint "
            f"(press Ctrl-C again to abort now)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> StopFlag:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class terminate_as_interrupt:  # noqa: N801 - used as a context manager, like contextlib's
    """Within the block, SIGTERM raises ``KeyboardInterrupt`` in the main thread, so ``finally``
    blocks run (DataLoader workers are shut down, temporary files removed) and the command ends as
    after Ctrl-C. Elsewhere than the main thread it does nothing."""

    def __enter__(self) -> terminate_as_interrupt:
        import signal
        import threading

        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
