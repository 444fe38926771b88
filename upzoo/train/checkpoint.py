"""Checkpoints that survive crashes: written atomically (temporary file, fsync, rename), verified
by a digest of their contents when loaded, and loaded with ``weights_only=True``.

A checkpoint is a plain ``torch.save`` dict (``torch.load`` reads it as usual) with two extra keys:
``format`` and ``digest``, a SHA-256 over every tensor's bytes and every other value, so that a
truncated or bit-flipped file is refused instead of loaded silently.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import torch

from upzoo.errors import DataError

__all__ = ["save_checkpoint", "load_checkpoint", "FORMAT"]

FORMAT = "upzoo-checkpoint/1"


def _digest(value: Any, h: "hashlib._Hash") -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, dict):
        h.update(b"D")
        for key in sorted(value, key=str):
            h.update(repr(key).encode())
            _digest(value[key], h)
    elif isinstance(value, (list, tuple)):
        h.update(b"L" if isinstance(value, list) else b"U")
        for item in value:
            _digest(item, h)
    else:
        h.update(repr(value).encode())


def digest(state: dict[str, Any]) -> str:
    """SHA-256 of a checkpoint's contents (``format`` and ``digest`` keys excluded)."""
    h = hashlib.sha256()
    _digest({k: v for k, v in state.items() if k not in ("format", "digest")}, h)
    return h.hexdigest()


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically: a crash leaves either the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {**state, "format": FORMAT, "digest": digest(state)}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(buffer.getbuffer())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return path


def load_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and verify a checkpoint written by :func:`save_checkpoint`.

    Raises:
        DataError: missing, truncated, unreadable or modified file (digest mismatch), naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, pickle errors, EOFError, ... for damaged files
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"checkpoint {path} is truncated or corrupt and was not loaded ({first})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise DataError(f"{path} is not an upzoo checkpoint (no {FORMAT!r} format tag)")
    if state.get("digest") != digest(state):
        raise DataError(f"checkpoint {path} is corrupt (its contents do not match their digest) and was not loaded")
    return state
