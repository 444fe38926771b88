"""The cache of generated data (synthetic sets, resampled volumes): one folder per kind and
parameters (a hash), generated once and reused; a folder without its completion marker (an
interrupted generation) is generated again, and a file lock lets one process (of several DDP ranks
or parallel runs) write while the others wait."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from upzoo.errors import ConfigError

__all__ = ["default_cache_dir", "cached"]

_MARKER = "COMPLETE.json"


def default_cache_dir() -> Path:
    """``$UPZOO_CACHE`` or ``~/.cache/upzoo``."""
    return Path(os.environ.get("UPZOO_CACHE") or Path.home() / ".cache" / "upzoo")


def cached(kind: str, params: dict, cache_dir: str | Path | None, write) -> Path:
    key = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
    root = Path(cache_dir or default_cache_dir()) / f"{kind}-{key}"
    marker = root / _MARKER
    if marker.is_file():
        return root
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        lock = open(root.parent / f".{root.name}.lock", "w")
    except OSError as exc:
        reason = "it is a file" if root.parent.is_file() else exc.strerror or str(exc)
        raise ConfigError(
            f"cannot write generated data (synthetic sets, resampled volumes) into data.cache_dir "
            f"{str(root.parent)!r}: {reason}; give a writable folder (or set UPZOO_CACHE)"
        ) from None
    with lock:  # one writer (DDP ranks, parallel runs)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():  # another process finished it while we waited
            return root
        if root.exists():
            shutil.rmtree(root)  # an interrupted generation: start again
        write(root)
        marker.write_text(json.dumps(params, indent=2))
    return root
