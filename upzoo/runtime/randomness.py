"""Seeding every random number generator, and their state saved in and restored from a checkpoint."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["seed_everything", "rng_state", "restore_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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
