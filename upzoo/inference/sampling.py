"""``sample_images``: images from a trained generator, seeded, with its post-filter applied as in
training (it is part of the generator's forward), written as PNGs and one grid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from upzoo.errors import ConfigError, DataError
from upzoo.runs.trained_model import LoadedModel
from upzoo.runtime import atomic_write
from upzoo.sections import MAX_SEED

__all__ = ["generate", "sample_images"]


def _latents(loaded: LoadedModel, num: int, seed: int) -> torch.Tensor:
    if loaded.task != "gan":
        raise ConfigError(f"{loaded.checkpoint} is a {loaded.task} run; sample needs a GAN (dcgan) run")
    for name, value, high in (("num", num, 10**7), ("seed", seed, MAX_SEED)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise ConfigError(f"{name} must be a whole number in 0..{high}, got {value!r}")
    return torch.randn(num, loaded.spec.options["latent_dim"], generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _batches(loaded: LoadedModel, z: torch.Tensor, batch_size: int):
    """Images in [-1, 1], one batch at a time (memory stays that of one batch)."""
    device = next(loaded.model.parameters()).device
    for chunk in z.split(batch_size):
        yield loaded.model(chunk.to(device)).float().cpu().clamp(-1, 1)


def generate(loaded: LoadedModel, num: int, *, seed: int = 0, batch_size: int = 64) -> torch.Tensor:
    """``(num, C, R, R)`` images in [-1, 1] from latents drawn with ``seed`` (the same seed gives
    the same images, whatever ``batch_size``)."""
    return torch.cat(list(_batches(loaded, _latents(loaded, num, seed), batch_size)))


def sample_images(
    loaded: LoadedModel, num: int, out: Path, *, seed: int = 0, overwrite: bool = False, nrow: int = 8
) -> dict[str, Any]:
    """Write ``sample_0000.png`` ... and ``grid.png`` (the first ``nrow``² samples) into ``out``,
    generating and writing one batch at a time.

    Raises:
        DataError: files already there without ``overwrite``.
    """
    from PIL import Image

    from upzoo.figures import sample_grid

    z = _latents(loaded, num, seed)
    names = [out / f"sample_{i:04d}.png" for i in range(num)] + [out / "grid.png"]
    existing = [p for p in names if p.exists()]
    if existing and not overwrite:
        raise DataError(f"{existing[0]} already exists; pass --overwrite to replace it or choose another --out")
    shown: list[torch.Tensor] = []
    index = 0
    for images in _batches(loaded, z, 64):
        shown += list(images[: max(0, nrow * nrow - len(shown))])
        pixels = ((images * 0.5 + 0.5) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        for array in pixels:
            image = Image.fromarray(np.ascontiguousarray(array[..., 0] if array.shape[2] == 1 else array))
            atomic_write(names[index], lambda tmp, image=image: image.save(tmp, format="PNG"))
            index += 1
    atomic_write(names[-1], lambda tmp: sample_grid(torch.stack(shown), tmp, nrow=nrow, format="png"))
    return {"samples": num, "out": str(out), "grid": str(names[-1]), "seed": seed}
