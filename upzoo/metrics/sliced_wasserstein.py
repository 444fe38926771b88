"""The sliced Wasserstein distance between two sets of images on Laplacian-pyramid patches
(Karras et al., "Progressive Growing of GANs", ICLR 2018), as their reference code defines it
(NVIDIA's ``progressive_growing_of_gans/metrics/sliced_wasserstein.py``), in PyTorch:

- each image (values 0..255) is split into a Laplacian pyramid (OpenCV's ``pyrDown``/``pyrUp``
  5x5 binomial filter, mirrored edges) down to 16x16: the finest level first, the coarsest one the
  Gaussian remainder;
- at each level ``patches_per_image`` (128) random 7x7 neighbourhoods are taken from every image;
- each set's descriptors are normalised per colour channel by that set's own mean and std;
- the distance per level is the mean over ``repeats`` (4) x ``directions`` (128) random unit
  directions of the mean absolute difference of the sorted projections, times 1e3;
- the result is the distance per level (finest first) and their mean.

Smaller is closer; a set against itself gives 0. The descriptors of every image are kept (float32,
``patches_per_image * 49 * C`` numbers per image and level), as in the reference.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from upzoo.checks import check_positive_int
from upzoo.collectives import all_gather_objects
from upzoo.errors import ShapeError
from upzoo.metrics.spectrum import as_unit_images
from upzoo.metrics.streaming import StreamingMetric

__all__ = ["SlicedWasserstein", "laplacian_pyramid", "sliced_wasserstein", "pyramid_levels"]

_BINOMIAL = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
_KERNEL = torch.outer(_BINOMIAL, _BINOMIAL) / 256.0


def _filter(x: torch.Tensor, gain: float) -> torch.Tensor:
    c = x.shape[1]
    kernel = (_KERNEL * gain).to(x).expand(c, 1, 5, 5)
    return F.conv2d(F.pad(x, (2, 2, 2, 2), mode="reflect"), kernel, groups=c)


def pyramid_levels(size: int, smallest: int = 16) -> int:
    """Levels of the pyramid of ``size`` x ``size`` images: the sizes ``size, size/2, ... >= smallest``."""
    levels = 0
    while size >= smallest:
        levels, size = levels + 1, size // 2
    return levels


def laplacian_pyramid(images: torch.Tensor, levels: int) -> list[torch.Tensor]:
    """``(N, C, H, W)`` -> ``levels`` tensors, finest first: band-pass differences, then the
    Gaussian remainder (``pyrDown``: blur, keep even pixels; ``pyrUp``: zero-insert, blur x4)."""
    pyramid = [images.float()]
    for _ in range(1, levels):
        down = _filter(pyramid[-1], 1.0)[:, :, ::2, ::2]
        up = torch.zeros_like(pyramid[-1])
        up[:, :, ::2, ::2] = down
        pyramid[-1] = pyramid[-1] - _filter(up, 4.0)
        pyramid.append(down)
    return pyramid


_BLOCK = 1024  # images whose patch positions are drawn together


def _positions(seed: int, level: int, start: int, n: int, count: int, size: tuple[int, int]) -> np.ndarray:
    """Centres ``(n, count, 2)`` of 7x7 patches of images ``start .. start + n`` of a set at a level of
    ``size``: drawn per block of 1,024 images from ``(seed, level, block)``, so that they do not depend
    on how the set was batched."""
    blocks = range(start // _BLOCK, (start + n - 1) // _BLOCK + 1)
    drawn = np.concatenate([np.random.default_rng([seed, level, b]).random((_BLOCK, count, 2)) for b in blocks])
    offset = start - blocks[0] * _BLOCK
    unit = drawn[offset : offset + n]
    return 3 + np.floor(unit * (np.asarray(size) - 6)).astype(np.int64)  # centres 3 .. size - 4


def _patches(level: torch.Tensor, centres: np.ndarray, size: int = 7) -> torch.Tensor:
    """The ``size`` x ``size`` neighbourhoods around ``centres`` ``(n, count, 2)``:
    ``(n * count, C, size, size)``."""
    n, c, h, w = level.shape
    count, half = centres.shape[1], size // 2
    ys, xs = (torch.from_numpy(centres[..., k]) for k in (0, 1))
    offsets = torch.arange(-half, half + 1)
    rows = (ys[..., None] + offsets)[..., :, None]  # (n, count, size, 1)
    cols = (xs[..., None] + offsets)[..., None, :]  # (n, count, 1, size)
    index = (rows * w + cols).reshape(n, 1, -1).expand(n, c, -1)
    patches = level.reshape(n, c, h * w).gather(2, index.to(level.device)).reshape(n, c, count, size, size)
    return patches.transpose(1, 2).reshape(n * count, c, size, size)


def _normalised(d: torch.Tensor) -> torch.Tensor:
    mean = d.double().mean(dim=(0, 2, 3), keepdim=True)
    std = d.double().std(dim=(0, 2, 3), keepdim=True, correction=0)
    return ((d - mean.float()) / std.float().clamp_min(1e-12)).reshape(len(d), -1)


def sliced_wasserstein(a: torch.Tensor, b: torch.Tensor, directions: torch.Tensor) -> float:
    """Mean over ``directions`` ``(D, K)`` of the mean ``|sort(a @ d) - sort(b @ d)|`` for descriptor
    sets ``a``, ``b`` ``(M, D)`` of equal size (the reference's ``sliced_wasserstein`` for one repeat).
    The projections are sorted by NumPy, row by row (its vectorised sort is many times PyTorch's on
    the CPU)."""
    projected_a = (directions.T @ a.T).numpy()  # (K, M), each row contiguous
    projected_b = (directions.T @ b.T).numpy()
    projected_a.sort(axis=1)
    projected_b.sort(axis=1)
    return float(np.abs(projected_a - projected_b).mean(dtype=np.float64))


def check_swd_options(**options: object) -> None:
    """SWD's options where they enter: ``patches_per_image``, ``repeats`` and ``directions`` whole
    numbers >= 1, ``seed`` >= 0 (those given).

    Raises:
        ConfigError: naming the option and the value that came.
    """
    for name, value in options.items():
        check_positive_int(value, f"SlicedWasserstein: {name}", minimum=0 if name == "seed" else 1)


class SlicedWasserstein(StreamingMetric):
    """SWD between a real and a generated set of images, fed batch by batch (see the module). Its
    states are the two sets' patch descriptors ``(patches, levels, C, 7, 7)``, gathered across DDP
    ranks by ``sync``.

    Args:
        patches_per_image: neighbourhoods per image and level (reference: 128).
        repeats: sets of random directions (reference: 4).
        directions: directions per set (reference: 128).
        seed: seeds the patch positions (the same for image ``i`` of either set, however the sets
            are batched) and the directions.
        sync_on_compute: whether :meth:`compute` combines the DDP ranks first (False for a metric
            that one rank alone computes; see :class:`~upzoo.metrics.StreamingMetric`).

    >>> swd = SlicedWasserstein(patches_per_image=16)
    >>> images = torch.rand(32, 3, 32, 32)
    >>> swd.update(images, real=True); swd.update(images, real=False)
    >>> swd.compute()["mean"]
    0.0
    """

    def __init__(
        self,
        patches_per_image: int = 128,
        repeats: int = 4,
        directions: int = 128,
        seed: int = 0,
        *,
        sync_on_compute: bool = True,
    ) -> None:
        check_swd_options(patches_per_image=patches_per_image, repeats=repeats, directions=directions, seed=seed)
        self.patches_per_image, self.repeats, self.directions = patches_per_image, repeats, directions
        self.seed = seed
        super().__init__(sync_on_compute=sync_on_compute)
        self.add_state("real_descriptors", None, "cat")
        self.add_state("generated_descriptors", None, "cat")
        self.seen = {True: 0, False: 0}  # images so far: the next image's index for its patch positions
        self.shape: tuple[int, ...] | None = None

    def reset(self) -> None:
        super().reset()
        self.seen = {True: 0, False: 0}
        self.shape = None

    sync_attributes = ("shape",)

    def _combine(self) -> None:
        """Gather every rank's descriptors (and the image shape, which a rank without images lacks).

        Raises:
            ShapeError: ranks that measured images of different shapes.
        """
        shapes = sorted({s for s in all_gather_objects(self.shape) if s is not None})
        if len(shapes) > 1:
            raise ShapeError(f"SWD: the ranks measured images of shapes {shapes[0]} and {shapes[1]}; use one size")
        super()._combine()
        self.shape = shapes[0] if shapes else None

    def _descriptors(self, real: bool) -> list[torch.Tensor]:
        return self.real_descriptors if real else self.generated_descriptors

    def update(self, images: torch.Tensor, *, real: bool) -> None:
        """Add a batch ``(N, C, H, W)`` (uint8, or float in [0, 1]) to the real or generated set.

        Raises:
            ShapeError: images smaller than 16x16, or of another shape than the earlier batches.
            ConfigError: images of another dtype, NaN, or values outside [0, 1].
        """
        x = as_unit_images(images, "real images" if real else "generated images") * 255.0
        shape = tuple(x.shape[1:])
        if self.shape is None:
            if min(shape[1:]) < 16:
                raise ShapeError(f"SWD needs images of at least 16x16 (its coarsest level), got {shape[1]}x{shape[2]}")
            self.shape = shape
        elif shape != self.shape:
            raise ShapeError(
                f"SWD compares images of one shape (C, H, W): {self.shape} so far, then {shape} in the "
                f"{'real' if real else 'generated'} set; resize one set"
            )
        pyramid = laplacian_pyramid(x, pyramid_levels(min(shape[1:])))
        rows = []
        for index, level in enumerate(pyramid):
            centres = _positions(self.seed, index, self.seen[real], len(x), self.patches_per_image, level.shape[-2:])
            rows.append(_patches(level, centres).cpu())
        self.seen[real] += len(x)
        self._descriptors(real).append(torch.stack(rows, 1))

    def compute(self) -> dict[str, float]:
        """``{"level_<size>": SWD x 1e3, ..., "mean": ...}``, finest level first.

        Raises:
            ShapeError: a set that is empty, or sets of different sizes (the reference compares
                equal numbers of descriptors).
        """
        counts = {real: sum(len(rows) for rows in self._descriptors(real)) for real in (True, False)}
        if not counts[True] or counts[True] != counts[False]:
            raise ShapeError(
                f"SWD compares equally many real and generated images; got {counts[True] // self.patches_per_image} "
                f"real and {counts[False] // self.patches_per_image} generated"
            )
        generator = torch.Generator().manual_seed(self.seed + 1)
        result: dict[str, float] = {}
        real, generated = torch.cat(self.real_descriptors), torch.cat(self.generated_descriptors)
        size = self.shape[1]
        for level in range(real.shape[1]):
            a, b = _normalised(real[:, level]), _normalised(generated[:, level])
            distances = []
            for _ in range(self.repeats):
                directions = torch.randn(a.shape[1], self.directions, generator=generator, dtype=torch.float64)
                directions = (directions / directions.norm(dim=0, keepdim=True)).float()
                distances.append(sliced_wasserstein(a, b, directions))
            result[f"level_{size >> level}"] = float(np.mean(distances)) * 1e3
        result["mean"] = float(np.mean(list(result.values())))
        return result


def swd(
    real: torch.Tensor,
    generated: torch.Tensor,
    *,
    patches_per_image: int = 128,
    repeats: int = 4,
    directions: int = 128,
    seed: int = 0,
) -> dict[str, float]:
    """The function form of :class:`SlicedWasserstein`: SWD x 1e3 per pyramid level and their mean
    between two equally large sets of images ``(N, C, H, W)`` (uint8, or float in [0, 1]).

    >>> images = torch.rand(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    >>> swd(images, images, patches_per_image=8)["mean"]
    0.0

    Raises:
        ShapeError: images that are not such batches, or sets of different sizes.
        ConfigError: options that are not whole numbers, or images of another dtype or range.
    """
    metric = SlicedWasserstein(
        patches_per_image=patches_per_image, repeats=repeats, directions=directions, seed=seed, sync_on_compute=False
    )
    metric.update(real, real=True)
    metric.update(generated, real=False)
    return metric.compute()
