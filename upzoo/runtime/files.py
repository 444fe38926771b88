"""Files written whole or not at all: a crash, Ctrl-C or a full disk leaves the old file or none, and
no temporary file behind; the temporaries of a killed writer are found and removed."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from upzoo.errors import DataError

__all__ = ["atomic_write", "write_error", "remove_stale_temporaries"]


def write_error(path: Path, exc: OSError) -> DataError:
    """An ``OSError`` while writing ``path`` as one line that says what to do."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        fix = "free space there or choose another folder"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        fix = "choose a folder you can write to"
    else:
        fix = "check the folder"
    return DataError(f"cannot write {path}: {reason}; {fix}")


def atomic_write(path: str | Path, write: Callable[[Path], Any], *, durable: bool = False) -> Path:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it over ``path``: a reader
    never sees half a file, and a failure leaves the old file and no temporary one. ``durable``
    also flushes the file and the rename to the disk (checkpoints).

    Raises:
        DataError: the folder cannot be written (full, read-only, ...): one line naming ``path``.
    """
    path = Path(path)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        if durable:
            _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, path)
        if durable:
            _fsync(path.parent, os.O_RDONLY)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
    return path


def _fsync(path: Path, flags: int) -> None:
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(folder: str | Path, *, recursive: bool = False) -> int:
    """Delete the temporary files of :func:`atomic_write` in ``folder`` (and below it, ``recursive``)
    whose writing process is gone (killed mid-write); returns how many. Call it while holding the
    folder's lock."""
    removed = 0
    pattern = "**/.tmp-*-*" if recursive else ".tmp-*-*"
    for tmp in Path(folder).glob(pattern):
        pid = tmp.name.split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                tmp.unlink()
                removed += 1
            except OSError:
                pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
