"""Checkpoints that survive crashes: written atomically (temporary file, fsync, rename), verified
by a digest of their contents when loaded, and loaded with ``weights_only=True``.

A checkpoint is a plain ``torch.save`` dict (``torch.load`` reads it as usual) with two extra keys:
``format`` and ``digest``, a SHA-256 over every tensor's bytes and every other value, so that a
truncated or bit-flipped file is refused instead of loaded silently.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch

from upzoo.errors import DataError
from upzoo.runtime import atomic_write

__all__ = ["save_checkpoint", "load_checkpoint", "load_weights", "FORMAT", "CHECKPOINT_KEYS"]

FORMAT = "upzoo-checkpoint/1"
CHECKPOINT_KEYS = {  # what each kind of run writes into its checkpoints
    "segmentation": (
        "kind",
        "run_id",
        "model",
        "optimizers",
        "schedulers",
        "step",
        "best_metric",
        "rng",
        "recipe",
        "model_spec",
    ),
    "gan": (
        "kind",
        "run_id",
        "generator",
        "discriminator",
        "optimizers",
        "schedulers",
        "step",
        "rng",
        "recipe",
        "model_spec",
    ),
}
CHECKPOINT_KEYS["super_resolution"] = CHECKPOINT_KEYS["segmentation"]  # one model, best.pt by a metric
CHECKPOINT_KEYS["feature_upsampling"] = CHECKPOINT_KEYS["segmentation"]
CHECKPOINT_KEYS["generator_testbed"] = CHECKPOINT_KEYS["segmentation"]
CHECKPOINT_KEYS["through_plane_sr"] = CHECKPOINT_KEYS["segmentation"]
CHECKPOINT_KEYS["through_plane_segmentation"] = CHECKPOINT_KEYS["segmentation"]


def _digest(value: Any, h: hashlib._Hash) -> None:
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
    atomic_write(path, lambda tmp: tmp.write_bytes(buffer.getbuffer()), durable=True)
    return path


def _read(path: Path, map_location: str | torch.device) -> Any:
    import pickle

    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise DataError(f"checkpoint {path} cannot be read: {exc.strerror or exc}") from None
    if head != b"PK\x03\x04":  # torch.save's zip container
        raise DataError(
            f"{path} is not a PyTorch checkpoint (no zip container: damaged, or another kind of file); not loaded"
        )
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only" in str(exc).lower():
            raise DataError(
                f"checkpoint {path} contains objects other than tensors and plain data, which upzoo "
                f"does not load; it was not written by upzoo (or was modified) and was not loaded"
            ) from None
        raise DataError(f"checkpoint {path} is truncated or corrupt and was not loaded") from None
    except Exception:  # torch raises RuntimeError, EOFError, ... for damaged files
        raise DataError(f"checkpoint {path} is truncated or corrupt and was not loaded") from None


def _kind_of(state: dict[str, Any]) -> str:
    return state.get("kind") or ("gan" if "generator" in state else "segmentation" if "model" in state else "unknown")


def load_checkpoint(
    path: str | Path, *, kind: str | None = None, purpose: str = "", map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Load and verify a checkpoint written by :func:`save_checkpoint`; with ``kind``
    (``segmentation``, ``gan``, ``super_resolution`` or ``feature_upsampling``) also that it is a
    complete checkpoint of that kind of run.

    Raises:
        DataError: missing, truncated, unreadable or modified file (digest mismatch), a file holding
            objects other than tensors and plain data, or a checkpoint of another kind; naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"checkpoint {path} does not exist")
    state = _read(path, map_location)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise DataError(f"{path} is not an upzoo checkpoint (no {FORMAT!r} format tag)")
    if state.get("digest") != digest(state):
        raise DataError(f"checkpoint {path} is corrupt (its contents do not match their digest) and was not loaded")
    if kind is not None:
        found = _kind_of(state)
        if found != kind:
            raise DataError(
                f"checkpoint {path} is from a {found} run; {purpose or 'this'} needs a checkpoint of a {kind} run"
            )
        missing = [key for key in CHECKPOINT_KEYS[kind] if key not in state]
        if missing:
            raise DataError(
                f"checkpoint {path} lacks {', '.join(missing)}: it is not a complete checkpoint of an upzoo {kind} run"
            )
    return state


def _describe_spec(spec: Any) -> str:
    if not isinstance(spec, dict):
        return "an unknown model"
    keys = ("architecture", "spatial_dims", "encoder", "in_channels", "num_classes", "channels", "upsampler")
    return ", ".join(f"{k}={spec[k]}" for k in keys if k in spec)


def load_weights(
    module: torch.nn.Module,
    weights: dict[str, Any],
    path: str | Path,
    *,
    saved_spec: Any = None,
    expected_spec: Any = None,
) -> None:
    """``module.load_state_dict(weights)`` with a one-line error when they do not fit.

    Raises:
        DataError: naming the checkpoint, what differs, and both models where known.
    """
    own = module.state_dict()
    missing = [k for k in own if k not in weights]
    extra = [k for k in weights if k not in own]
    wrong = [k for k in own if k in weights and tuple(weights[k].shape) != tuple(own[k].shape)]
    if not (missing or extra or wrong):
        module.load_state_dict(weights)
        return
    first = (missing or extra or wrong)[0]
    detail = (
        f"{len(missing)} missing, {len(extra)} unexpected and {len(wrong)} differently shaped tensors "
        f"(first: {first!r})"
    )
    models = ""
    if saved_spec is not None or expected_spec is not None:
        models = (
            f"; the checkpoint holds {_describe_spec(saved_spec)}, this recipe builds {_describe_spec(expected_spec)}"
        )
    raise DataError(f"checkpoint {path} does not fit this model: {detail}{models}")
