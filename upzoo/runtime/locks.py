"""One writer per folder: an exclusive lock held until released or the process ends."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from upzoo.errors import ConfigError

__all__ = ["FolderLock"]


class FolderLock:
    """An exclusive lock on ``folder/name`` (``fcntl.flock``) held until :meth:`release` or process
    exit, even a crash: one writer per folder. ``transient`` locks delete their file on release (an
    output folder keeps only the outputs); a lock is taken only on the file that is at the path,
    so a holder that deleted it cannot share it with a newcomer.

    Raises:
        ConfigError: the folder cannot be written, or another process holds the lock (``busy``).
    """

    def __init__(self, folder: str | Path, busy: str, name: str = ".lock", *, transient: bool = False) -> None:
        self.fd: int | None = None
        self.path, self.transient = Path(folder) / name, transient
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"folder {str(self.path.parent)!r} is not writable: {exc.strerror or exc}") from None
        for _ in range(100):  # another holder deleted the file between our open and our lock: again
            fd = self._lock(busy)
            try:
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    self.fd = fd
                    return
            except FileNotFoundError:
                pass
            os.close(fd)
        raise ConfigError(busy)

    def _lock(self, busy: str) -> int:
        import fcntl

        try:
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            raise ConfigError(f"folder {str(self.path.parent)!r} is not writable: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(busy) from None
        return fd

    def release(self) -> None:
        if self.fd is not None:
            if self.transient:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()
