"""Reading and writing image and label files with errors that name the file.

One image reader serves training and prediction. Its rules:

* EXIF orientation is applied (a photo comes out the way a viewer shows it).
* Pixel values are scaled by the range of their type: 8-bit as they are, 16-bit (grayscale or
  colour PNG/TIFF) by 255 / 65535, float images (TIFF) must hold finite values in [0, 1] and are
  scaled by 255. Models take 8-bit pixels, as in training; finer steps are rounded to 8 bits.
* Palette images are expanded through their palette; 1-bit images become 0 / 255.
* An alpha channel is dropped (the colour channels are used as they are).
* Grayscale is repeated to three channels for an RGB model; colour is converted to luminance
  (ITU-R 601-2, as PIL does) for a one-channel model.
* Anything else (32-bit integer images outside 0..65535, NaN or inf, float values outside [0, 1],
  an unknown mode) is refused with one line naming the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from upzoo.errors import DataError

__all__ = ["read_image", "read_label", "write_png", "pixels_to_unit", "read_alpha_and_gray"]

_EIGHT_BIT = ("L", "LA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr", "LAB", "HSV", "1", "P", "PA", "La", "RGBa")


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
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise DataError(f"{path}: unreadable or truncated image ({exc})") from None


def pixels_to_unit(array: np.ndarray, what: str) -> np.ndarray:
    """Pixel values scaled by their type's range to float32 in [0, 1]: uint8 by 255, uint16 by
    65535, floats as they are (they must be finite and in [0, 1]).

    >>> pixels_to_unit(np.array([0, 255], dtype=np.uint8), "x").tolist()
    [0.0, 1.0]

    Raises:
        DataError: another dtype, non-finite values, or floats outside [0, 1]; naming ``what``.
    """
    if array.dtype == np.uint8:
        return array.astype(np.float32) / 255.0
    if array.dtype == np.uint16:
        return array.astype(np.float32) / 65535.0
    if np.issubdtype(array.dtype, np.floating):
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        if bad:
            raise DataError(
                f"{what}: {bad} pixel value(s) are NaN or infinite; replace them (e.g. numpy.nan_to_num) first"
            )
        low, high = (float(array.min()), float(array.max())) if array.size else (0.0, 0.0)
        if low < 0.0 or high > 1.0:
            raise DataError(
                f"{what}: float pixels must lie in [0, 1], got values in [{low:.6g}, {high:.6g}]; "
                f"rescale them, or pass uint8 (0..255) or uint16 (0..65535) pixels"
            )
        return array.astype(np.float32)
    raise DataError(
        f"{what}: pixels of type {array.dtype} are not read (their range is unknown); pass uint8 (0..255), "
        f"uint16 (0..65535) or float in [0, 1]"
    )


def _to_uint8(unit: np.ndarray) -> np.ndarray:
    return np.rint(unit * 255.0).astype(np.uint8)


def _high_depth(img: Image.Image, path: Path) -> np.ndarray:
    """16-bit and float grayscale modes as uint8."""
    array = np.array(img)
    if img.mode == "I":  # PIL's 32-bit integer mode: 16-bit files often open as it
        if array.size and (array.min() < 0 or array.max() > 65535):
            raise DataError(
                f"{path}: 32-bit integer pixels in [{int(array.min())}, {int(array.max())}] are outside 0..65535; "
                f"save the image as 8- or 16-bit"
            )
        array = array.astype(np.uint16)
    elif img.mode.startswith("I;16"):
        array = array.astype(np.uint16)
    return _to_uint8(pixels_to_unit(array, str(path)))


def _with_channels(array: np.ndarray, channels: int, path: Path) -> np.ndarray:
    """``(H, W)`` or ``(H, W, 3)`` uint8 -> ``(H, W, channels)`` (``(H, W)`` for one channel)."""
    if channels == 1:
        if array.ndim == 3:  # ITU-R 601-2 luma, PIL's "L" conversion
            weights = np.array([299, 587, 114], dtype=np.uint32)
            array = ((array[..., :3].astype(np.uint32) * weights).sum(-1) + 500) // 1000
            array = array.astype(np.uint8)
        return array
    if channels == 3:
        return np.repeat(array[..., None], 3, axis=2) if array.ndim == 2 else array
    raise DataError(f"{path}: upzoo reads images as 1 or 3 channels; the model takes {channels}")


def _read_with_opencv(path: Path, error: DataError) -> np.ndarray:
    """TIFFs PIL cannot decode (float or 16-bit colour): read with OpenCV, as uint8 RGB or gray."""
    import cv2

    array = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if array is None:
        raise error
    if array.ndim == 3:
        array = cv2.cvtColor(array[..., :3], cv2.COLOR_BGR2RGB)
    return _to_uint8(pixels_to_unit(array, str(path)))


def read_image(path: str | Path, channels: int = 3) -> np.ndarray:
    """An image as ``(H, W, 3)`` uint8 (``channels=1``: ``(H, W)``), by the rules of this module.

    Raises:
        DataError: missing, unreadable, or pixels that cannot be read right; naming the file.
    """
    path = Path(path)
    try:
        img = _open(path)
    except DataError as exc:
        if path.suffix.lower() in (".tif", ".tiff") and path.is_file():
            return _with_channels(_read_with_opencv(path, exc), channels, path)
        raise
    try:
        img = ImageOps.exif_transpose(img)
    except Exception:  # a damaged EXIF block: the pixels are still fine
        pass
    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
        return _with_channels(_high_depth(img, path), channels, path)
    if img.mode not in _EIGHT_BIT:
        raise DataError(f"{path}: image mode {img.mode!r} is not read; save it as 8- or 16-bit grayscale or RGB")
    gray = img.mode in ("1", "L", "LA", "La")  # palette, alpha and other colour modes become RGB
    return _with_channels(np.array(img.convert("L" if gray else "RGB")), channels, path)


def read_alpha_and_gray(path: str | Path) -> tuple[np.ndarray | None, bool]:
    """What :func:`read_image` leaves out of an image: its alpha channel (``(H, W)`` uint8, oriented
    as the pixels; ``None`` without one) and whether it is grayscale. Files only PIL cannot open
    (some TIFFs) count as opaque colour images.
    """
    try:
        img = _open(Path(path))
    except DataError:
        return None, False
    try:
        img = ImageOps.exif_transpose(img)
    except Exception:  # a damaged EXIF block: as read_image
        pass
    gray = img.mode in ("1", "L", "LA", "La", "I", "F") or img.mode.startswith("I;16")
    has_alpha = img.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in img.info
    return (np.array(img.convert("RGBA"))[..., 3] if has_alpha else None), gray


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
    from upzoo.runtime import atomic_write

    atomic_write(Path(path), lambda tmp: Image.fromarray(array).save(tmp, format="PNG"))
