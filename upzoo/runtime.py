"""What every command needs from its surroundings, each once: the device a user names, mixed
precision, seeding and RNG state, stopping at a step boundary on Ctrl-C/SIGTERM, files written whole
or not at all (a crash, Ctrl-C or a full disk leaves the old file or none, and no temporary file
behind), one writer per folder (a lock), and warnings re-emitted at the user's call."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from upzoo.errors import ConfigError, DataError

__all__ = [
    "resolve_device",
    "autocast",
    "needs_grad_scaler",
    "seed_everything",
    "rng_state",
    "restore_rng_state",
    "StopFlag",
    "terminate_as_interrupt",
    "atomic_write",
    "write_error",
    "FolderLock",
    "remove_stale_temporaries",
    "main_output",
    "warnings_at_caller",
]


def resolve_device(device: Any, what: str = "device") -> Any:
    """``"auto"`` (CUDA when available, else the CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a
    ``torch.device`` -> a ``torch.device`` that exists here.

    >>> resolve_device("cpu")
    device(type='cpu')

    Raises:
        ConfigError: another kind of device, or CUDA where none is available; naming ``what``.
    """
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise ConfigError(f"{what} must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r} ({type(device).__name__})")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    index = device[5:] if device.startswith("cuda:") else ""
    if device not in ("cpu", "cuda") and not index.isdigit():
        raise ConfigError(f"{what} must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"{what} {device!r}: no CUDA device is available here; use 'cpu' or 'auto'")
        if index and int(index) >= torch.cuda.device_count():
            raise ConfigError(f"{what} {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    return torch.device(device)


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


def main_output(out: Any) -> Any:
    """A model's main output: the first of a tuple or list (deep supervision), else the output."""
    return out[0] if isinstance(out, (list, tuple)) else out


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


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def autocast(amp: str, device: torch.device, name: str = "train.amp") -> contextlib.AbstractContextManager:
    """bfloat16/float16 autocast (float16 only on CUDA), or nothing; ``name`` is the setting an error
    names."""
    if amp == "none":
        return contextlib.nullcontext()
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError(f"{name} 'fp16' needs CUDA; on the CPU use 'bf16'")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


def needs_grad_scaler(amp: str, device: torch.device) -> bool:
    return amp == "fp16" and device.type == "cuda"


def rng_state() -> dict[str, Any]:
    """Every RNG's state as plain tensors and lists (loadable with ``weights_only=True``)."""
    version, state, gauss = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [version, list(state), gauss],
        "numpy": [
            np_state[0],
            torch.from_numpy(np_state[1].astype(np.int64)),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    version, values, gauss = state["python"]
    random.setstate((version, tuple(values), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


class warnings_at_caller:  # noqa: N801 - used as a context manager, like contextlib's
    """Re-emit the warnings raised inside the block, prefixed, at the caller of the function that
    holds the ``with`` — so a warning points at the user's own call (``UNet(...)``,
    ``create_upsampler(...)``), not at upzoo's internals."""

    def __init__(self, prefix: str = "", stacklevel: int = 3) -> None:
        self.prefix, self.stacklevel = prefix, stacklevel

    def __enter__(self) -> warnings_at_caller:
        self._catcher = warnings.catch_warnings(record=True)
        self._caught = self._catcher.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc: object) -> None:
        self._catcher.__exit__(*exc)
        for caught in self._caught:
            text = str(caught.message)
            message = text if text.startswith(self.prefix) else self.prefix + text
            warnings.warn(message, caught.category, stacklevel=self.stacklevel)
