"""Reading and writing image and label files with errors that name the file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from upzoo.errors import DataError

__all__ = ["read_image", "read_label", "write_png"]


def _open(path: Path) -> Image.Image:
    try:
        img = Image.open(path)
        img.load()  # decode now: truncated files fail here
        return img
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except Image.DecompressionBombError as exc:
        raise DataError(
            f"{path}: the image header claims more pixels than upzoo reads safely ({exc}); "
            f"check the file, or raise PIL.Image.MAX_IMAGE_PIXELS if it is genuine"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise DataError(f"{path}: unreadable or truncated image ({exc})") from None


def read_image(path: str | Path) -> np.ndarray:
    """An RGB image as ``(H, W, 3)`` uint8."""
    return np.array(_open(Path(path)).convert("RGB"))  # a writable copy


def read_label(path: str | Path) -> np.ndarray:
    """A single-channel label map as ``(H, W)`` uint8 (8-bit or 16-bit PNGs with values < 256).

    Raises:
        DataError: unreadable, multi-channel, or values that do not fit in 8 bits.
    """
    path = Path(path)
    img = _open(path)
    if img.mode not in ("L", "P", "I", "I;16", "1"):
        raise DataError(f"{path}: a label map has one channel, got mode {img.mode!r}")
    array = np.array(img)
    if array.max(initial=0) > 255:
        raise DataError(f"{path}: label values above 255 ({int(array.max())})")
    return array.astype(np.uint8)


def write_png(path: str | Path, array: np.ndarray) -> None:
    """Write a uint8 array as PNG atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    Image.fromarray(array).save(tmp, format="PNG")
    os.replace(tmp, path)
