"""``sample_images``: images from a trained generator, seeded, with its post-filter applied as in
training (it is part of the generator's forward), written as PNGs and one grid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from upzoo.errors import ConfigError, DataError
from upzoo.inference.files import atomic_write
from upzoo.inference.loaded import LoadedModel

__all__ = ["generate", "sample_images"]


@torch.no_grad()
def generate(loaded: LoadedModel, num: int, *, seed: int = 0, batch_size: int = 64) -> torch.Tensor:
    """``(num, C, R, R)`` images in [-1, 1] from latents drawn with ``seed`` (the same seed gives
    the same images, whatever ``batch_size``)."""
    if loaded.task != "gan":
        raise ConfigError(f"{loaded.checkpoint} is a {loaded.task} run; sample needs a GAN (dcgan) run")
    latent = loaded.spec.options["latent_dim"]
    z = torch.randn(num, latent, generator=torch.Generator().manual_seed(seed))
    device = next(loaded.model.parameters()).device
    parts = [loaded.model(chunk.to(device)).float().cpu() for chunk in z.split(batch_size)]
    return torch.cat(parts).clamp(-1, 1)


def sample_images(
    loaded: LoadedModel, num: int, out: Path, *, seed: int = 0, overwrite: bool = False, nrow: int = 8
) -> dict[str, Any]:
    """Write ``sample_0000.png`` ... and ``grid.png`` into ``out``.

    Raises:
        DataError: files already there without ``overwrite``.
    """
    from PIL import Image

    from upzoo.train.plots import sample_grid

    names = [out / f"sample_{i:04d}.png" for i in range(num)] + [out / "grid.png"]
    existing = [p for p in names if p.exists()]
    if existing and not overwrite:
        raise DataError(f"{existing[0]} already exists; pass --overwrite to replace it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    images = generate(loaded, num, seed=seed)
    pixels = ((images * 0.5 + 0.5) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    for path, array in zip(names, pixels):
        image = Image.fromarray(np.ascontiguousarray(array[..., 0] if array.shape[2] == 1 else array))
        atomic_write(path, lambda tmp, image=image: image.save(tmp, format="PNG"))
    atomic_write(names[-1], lambda tmp: sample_grid(images, tmp, nrow=nrow, format="png"))
    return {"samples": num, "out": str(out), "grid": str(names[-1]), "seed": seed}
