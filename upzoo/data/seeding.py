"""Per-sample seeds, so augmentation depends only on (seed, epoch, index): the same batches after a
resume, with any number of loader workers or ranks."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["sample_seed", "reseed"]


def sample_seed(*keys: int) -> int:
    """A 32-bit seed derived from integer keys (numpy's SeedSequence)."""
    return int(np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in keys]).generate_state(1)[0])


def reseed(transform: Any, *keys: int) -> None:
    """Seed an albumentations pipeline (anything with ``set_random_seed``) from ``keys``."""
    if transform is not None and hasattr(transform, "set_random_seed"):
        transform.set_random_seed(sample_seed(*keys))
