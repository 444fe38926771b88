"""The device a user names and the mixed precision it runs under."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from upzoo.errors import ConfigError

__all__ = ["resolve_device", "autocast", "needs_grad_scaler"]


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
