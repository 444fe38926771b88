"""Upscaling images of any size with a super-resolution run: whole, or in overlapping tiles whose
outputs are stitched so that the result equals the whole-image one.

A tile is read with ``halo`` extra input pixels on each side (the model's receptive radius,
measured from the gradient of one output pixel), and only its core is kept: every output pixel
then comes from a tile that holds its whole receptive field, with the image's true border where
the image ends — the same sums as the whole image, so tiled and untiled outputs agree to float
rounding (memory is bounded by the tile, not the image). 16-bit inputs give 16-bit outputs.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import numpy as np
import torch
from torch import nn

from upzoo.checks import check_finite, check_positive_int
from upzoo.errors import ConfigError, DataError, ShapeError

__all__ = ["receptive_radius", "check_tiling", "upscale", "read_unit_image", "write_unit_image"]


@torch.no_grad()
def _extent(model: nn.Module, channels: int, size: int, scale: int, seed: int) -> int:
    """The largest distance, in input pixels, from the centre of a ``size`` input at which the
    central output pixels' gradient is non-zero."""
    x = torch.rand(1, channels, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x.requires_grad_(True)
    with torch.enable_grad():
        out = model(x)
        centre = size // 2 * scale
        out[..., centre : centre + scale, centre : centre + scale].sum().backward()
    hit = (x.grad.abs().sum(dim=(0, 1)) > 0).nonzero()
    return int((hit - size // 2).abs().max()) if len(hit) else 0


_RADII: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(channels, scale, versions): radius}


def receptive_radius(model: nn.Module, channels: int, scale: int) -> int:
    """How many input pixels on each side one input pixel's outputs depend on (measured on the
    CPU in float64 from two random inputs; grows the probe until the field fits inside it). Kept
    per model until its weights change in place (their version counters), so repeated ``upscale``
    calls measure once.

    A model that declares ``receptive_radius_bound`` (an int: the networks with shipped weights,
    whose fields are hundreds of pixels wide, too costly to probe) is taken at its word.

    Raises:
        ConfigError: a field wider than 1024 input pixels (a model with a global operation cannot
            be tiled exactly).
    """
    declared = getattr(model, "receptive_radius_bound", None)
    if isinstance(declared, int):
        return declared
    key = (channels, scale, tuple(t._version for t in model.state_dict(keep_vars=True).values()))
    known = _RADII.setdefault(model, {})
    if key not in known:
        known.clear()
        known[key] = _measured_radius(model, channels, scale)
    return known[key]


def _measured_radius(model: nn.Module, channels: int, scale: int) -> int:
    probe = _probe(model)
    size = 33
    while size <= 2049:
        radius = max(_extent(probe, channels, size, scale, seed) for seed in (0, 1))
        if radius < size // 2 - 1:
            return radius
        size = 2 * size - 1
    raise ConfigError("this model's outputs depend on the whole image (no finite receptive field); upscale it whole")


def _probe(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model).to("cpu", torch.float64).eval()


def _tile_starts(length: int, core: int) -> list[int]:
    return list(range(0, length, core))


def _check_image(image: object, channels: int | None) -> torch.Tensor:
    """``(C, H, W)`` floats in [0, 1] without NaN, or a one-line error saying how to get there.

    Raises:
        ShapeError: not a ``(C, H, W)`` tensor, or another channel count than the model's.
        ConfigError: integer pixels (uint8), values outside [0, 1] (0-255 floats), NaN or inf.
    """
    if not isinstance(image, torch.Tensor) or image.ndim != 3:
        shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
        raise ShapeError(f"upscale: image must be a (C, H, W) tensor, got {shape}; add or drop the batch axis")
    if channels is not None and image.shape[0] != channels:
        raise ShapeError(f"upscale: this model takes {channels} channels, the image has {image.shape[0]}")
    if not image.is_floating_point():
        raise ConfigError(
            f"upscale: image must be floats in [0, 1], got {image.dtype}; convert with image.float() / 255"
        )
    check_finite(image, "upscale: image")
    low, high = float(image.min()), float(image.max())
    if low < -1e-6 or high > 1 + 1e-6:
        raise ConfigError(
            f"upscale: image must be in [0, 1], got values in [{low:g}, {high:g}]; divide 0-255 pixels by 255"
        )
    return image


def check_tiling(
    model: nn.Module, channels: int, scale: int, tile: object, halo: object = None, name: str = "upscale: tile"
) -> tuple[int, int]:
    """``(tile, halo)`` checked, the one rule of ``upscale`` and ``upzoo predict --tile``: the halo
    defaults to the model's receptive radius, a smaller one (whose tiles would show seams) is
    refused, and a tile must keep a core of at least one pixel, ``tile >= 2 * halo + 1``.

    Raises:
        ConfigError: a tile or halo that is not a whole number (>= 1, >= 0), a halo below the
            receptive radius, or a tile that keeps nothing (``name`` names the tile's option).
    """
    tile = check_positive_int(tile, name)
    radius = receptive_radius(model, channels, scale)
    halo = radius if halo is None else check_positive_int(halo, "upscale: halo", minimum=0)
    if halo < radius:
        raise ConfigError(
            f"upscale: halo {halo} is smaller than this model's receptive radius ({radius} input pixels): the tiles "
            f"would show seams; leave halo unset (it is the radius) or give >= {radius}"
        )
    if tile - 2 * halo < 1:
        raise ConfigError(
            f"{name} {tile} keeps nothing of a halo of {halo} pixels on each side (this model's receptive radius is "
            f"{radius}); use {name.split(': ')[-1]} >= {2 * halo + 1}"
        )
    return tile, halo


@torch.no_grad()
def upscale(
    model: nn.Module, image: torch.Tensor, scale: int, *, tile: int | None = None, halo: int | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:  # fmt: skip
    """``(C, H, W)`` in [0, 1] -> ``(C, H * scale, W * scale)`` (not clamped), whole or in tiles of
    ``tile`` input pixels whose outputs equal the whole image's: each tile reads ``halo`` pixels of
    context on each side and keeps its ``tile - 2 * halo`` core. ``halo`` defaults to the model's
    receptive radius (:func:`receptive_radius`, as ``upzoo predict --tile`` uses); a smaller one is
    refused, since its tiles would show seams.

    Raises:
        ShapeError: not a ``(C, H, W)`` tensor, or another channel count than the model's.
        ConfigError: integer or 0-255 pixels, NaN, a ``tile``/``halo`` that is not a whole number,
            a halo below the receptive radius, a tile that keeps nothing, or a ``scale`` other than
            the model's own (its ``scale`` attribute, where it has one).
    """
    trained = getattr(model, "scale", scale)
    if trained != scale:
        raise ConfigError(f"this model upscales x{trained}, not x{scale}: it works at the scale it was trained for")
    image = _check_image(image, getattr(model, "in_channels", None))
    device = torch.device(device)
    if tile is not None:
        tile, halo = check_tiling(model, image.shape[0], scale, tile, halo)
    return tiled_output(model, image, scale, tile, halo or 0, device)


@torch.no_grad()
def tiled_output(
    model: nn.Module, image: torch.Tensor, scale: int, tile: int | None, halo: int, device: torch.device,
    progress: bool = False,
) -> torch.Tensor:  # fmt: skip
    """:func:`upscale`'s computation on an image and tiling already checked (``upzoo predict``
    checks them once for all its files); ``progress`` shows a bar over the tiles."""
    from tqdm import tqdm

    height, width = image.shape[-2:]
    if tile is None or (height <= tile and width <= tile):
        return model(image[None].to(device)).float().cpu()[0]
    core = tile - 2 * halo
    out = torch.empty(image.shape[0], height * scale, width * scale)
    corners = [(top, left) for top in _tile_starts(height, core) for left in _tile_starts(width, core)]
    for top, left in tqdm(corners, desc="tiles", unit="tile", leave=False, disable=not progress):
        y0, x0 = max(top - halo, 0), max(left - halo, 0)
        y1, x1 = min(top + core + halo, height), min(left + core + halo, width)
        result = model(image[None, :, y0:y1, x0:x1].to(device)).float().cpu()[0]
        bottom, right = min(top + core, height), min(left + core, width)
        keep = result[:, (top - y0) * scale : (bottom - y0) * scale, (left - x0) * scale : (right - x0) * scale]
        out[:, top * scale : bottom * scale, left * scale : right * scale] = keep
    return out


def read_unit_image(path: Path, channels: int) -> tuple[torch.Tensor, int]:
    """An image as ``(C, H, W)`` float32 in [0, 1] at its full precision, and its bit depth (8 or
    16): 16-bit PNG/TIFF keep their 65536 steps (read with OpenCV), everything else goes through
    upzoo's image reader.

    Raises:
        DataError: unreadable files or other channel counts, naming the file.
    """
    import cv2

    from upzoo.data.io import read_image

    array = cv2.imread(str(path), cv2.IMREAD_UNCHANGED) if path.suffix.lower() in (".png", ".tif", ".tiff") else None
    if array is not None and array.dtype == np.uint16:
        if array.ndim == 3 and array.shape[2] not in (3, 4):
            raise DataError(f"{path}: a 16-bit image with {array.shape[2]} channels; give RGB or grayscale")
        if array.ndim == 3:
            array = cv2.cvtColor(array[..., :3], cv2.COLOR_BGR2RGB)
            if channels == 1:
                array = np.rint(array.astype(np.float64) @ [0.299, 0.587, 0.114]).astype(np.uint16)
        elif channels == 3:
            array = np.repeat(array[..., None], 3, axis=2)
        tensor, bits = torch.from_numpy(array.astype(np.float32) / 65535.0), 16
    else:
        tensor, bits = torch.from_numpy(read_image(path, channels=channels).astype(np.float32) / 255.0), 8
    return (tensor[None] if tensor.ndim == 2 else tensor.permute(2, 0, 1)).contiguous(), bits


def write_unit_image(path: Path, image: torch.Tensor, bits: int) -> None:
    """``(C, H, W)`` in [0, 1] (clamped; C = 1, 2 (gray + alpha), 3 or 4 (RGBA)) as an 8- or 16-bit
    PNG, written atomically."""
    import cv2

    from upzoo.runtime import atomic_write

    array = image.clamp(0, 1).permute(1, 2, 0).numpy()
    array = np.rint(array * (65535.0 if bits == 16 else 255.0)).astype(np.uint16 if bits == 16 else np.uint8)
    if array.shape[2] == 2:  # gray + alpha: PNG has the mode, OpenCV writes it as BGRA
        array = np.concatenate([np.repeat(array[..., :1], 3, axis=2), array[..., 1:]], axis=2)
    if array.shape[2] in (3, 4):
        array = cv2.cvtColor(array, cv2.COLOR_RGB2BGR if array.shape[2] == 3 else cv2.COLOR_RGBA2BGRA)

    def save(tmp: Path) -> None:
        ok, encoded = cv2.imencode(".png", array[..., 0] if array.shape[2] == 1 else array)
        if not ok:
            raise DataError(f"{path}: OpenCV could not encode the PNG")
        tmp.write_bytes(encoded.tobytes())

    atomic_write(path, save)
