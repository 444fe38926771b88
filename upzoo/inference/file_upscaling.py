"""``upscale_files``: a super-resolution run over many image files (``upzoo predict`` on an SR run):
``OUT/NAME.png`` at the input's bit depth, and ``predictions.csv``."""

from __future__ import annotations

import csv
import functools
import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from upzoo.errors import ConfigError, DataError, UpzooError
from upzoo.inference.files import named_inputs
from upzoo.inference.run import planned_outputs
from upzoo.inference.tiled_upscaling import check_tiling, read_unit_image, tiled_output, write_unit_image
from upzoo.runs.trained_model import LoadedModel
from upzoo.runtime import FolderLock, atomic_write, autocast, terminate_as_interrupt

__all__ = ["Upscaler", "upscale_files", "tiling", "write_csv"]


@dataclass(frozen=True)
class Upscaler:
    """A super-resolution network with its channel count and scale: a trained run's model
    (:meth:`of`) or a network with shipped weights (``upzoo upscale``)."""

    model: nn.Module
    channels: int
    scale: int

    @classmethod
    def of(cls, loaded: LoadedModel) -> Upscaler:
        options = loaded.spec.options
        return cls(loaded.model, options.get("in_channels", 3), options["scale"])

    @functools.cached_property
    def largest_probe_output(self) -> int:
        """The most elements any layer outputs on a 16x16 input (measured once per upscaler)."""
        largest = [0]

        def record(_module: nn.Module, _inputs: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor):
                largest[0] = max(largest[0], out.numel())

        hooks = [m.register_forward_hook(record) for m in self.model.modules() if not list(m.children())]
        try:
            with torch.no_grad():
                self.model(torch.full((1, self.channels, 16, 16), 0.5))
        finally:
            for hook in hooks:
                hook.remove()
        return largest[0]


def tiling(upscaler: Upscaler, tile: int | None) -> tuple[int | None, int]:
    """``(tile, halo)`` for ``--tile`` (``None``: whole images), by the rule of ``upscale``
    (:func:`~upzoo.inference.tiled_upscaling.check_tiling`): the halo is the model's receptive radius.

    Raises:
        ConfigError: a tile that keeps no core inside the halo (``< 2 * radius + 1``).
    """
    if tile is None:
        return None, 0
    return check_tiling(upscaler.model, upscaler.channels, upscaler.scale, tile, name="--tile")


def upscale_files(
    loaded: LoadedModel | Upscaler, inputs: Sequence[str | Path], out: Path, *, tile: int | None = None,
    device: torch.device | str = "cpu", amp: bool = False, overwrite: bool = False, keep_going: bool = False,
    progress: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Upscale every input image into ``out``; returns ``{written, failed, csv, seconds, tile, halo}``.

    Raises:
        DataError: an unreadable input (with ``keep_going`` listed in ``failed``), outputs that exist
            without ``overwrite``, collide, or an ``out`` that holds inputs. ConfigError: as :func:`tiling`.
    """
    start = time.perf_counter()
    upscaler = loaded if isinstance(loaded, Upscaler) else Upscaler.of(loaded)
    tile, halo = tiling(upscaler, tile)
    named = named_inputs(inputs, volumes=False, exclude=out)
    planned = planned_outputs(named, out, overwrite, lambda name: {"image": out / f"{name}.png"})
    lock = FolderLock(out, f"another upzoo predict is writing into {out}; wait for it or choose another --out",
                      name=".predict.lock", transient=True)  # fmt: skip
    with lock, terminate_as_interrupt():
        planned = planned_outputs(named, out, overwrite, lambda name: {"image": out / f"{name}.png"})
        rows, failed = _run(upscaler, named, planned, tile, halo, torch.device(device), amp, keep_going, progress)
        write_csv(out / "predictions.csv", rows)
    return {"written": len(rows), "failed": failed, "csv": str(out / "predictions.csv"),
            "seconds": round(time.perf_counter() - start, 3), "tile": tile, "halo": halo}  # fmt: skip


def _run(upscaler, named, planned, tile, halo, device, amp, keep_going, progress) -> tuple[list, list]:
    from tqdm import tqdm

    channels, scale = upscaler.channels, upscaler.scale
    rows, failed = [], []
    for (path, _), outputs in tqdm(list(zip(named, planned)), desc="upscale", unit="file", disable=not progress):
        try:
            image, bits = read_unit_image(path, channels)
        except UpzooError as exc:
            if not keep_going:
                raise DataError(f"{exc} (--keep-going skips such files)") from None
            failed.append((str(path), str(exc)))
            continue
        began = time.perf_counter()
        with torch.no_grad(), autocast("bf16" if amp else "none", device, "--amp"):
            if tile is None and device.type == "cpu":
                check_whole_image_fits(upscaler, image.shape[-2:], path)
            result = tiled_output(upscaler.model, image, scale, tile, halo, device, progress=progress)
        result, note = _as_the_input(result, path, channels, scale)
        write_unit_image(outputs["image"], result, bits)
        rows.append({"file": str(path), "output": str(outputs["image"]),
                     "input_size": f"{image.shape[1]}x{image.shape[2]}",
                     "output_size": f"{result.shape[1]}x{result.shape[2]}", "bits": bits, "note": note,
                     "seconds": round(time.perf_counter() - began, 4)})  # fmt: skip
    return rows, failed


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as a CSV file (atomically; nothing when there are none)."""
    if not rows:
        return
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, lambda tmp: tmp.write_text(buffer.getvalue()))


def _as_the_input(result: torch.Tensor, path: Path, channels: int, scale: int) -> tuple[torch.Tensor, str]:
    """A colour network's output made what the input was, with a note for the CSV: a grayscale
    input back to grayscale (ITU-R 601 luma), an alpha channel upscaled bicubically and added."""
    from upzoo.data.io import read_alpha_and_gray

    alpha, gray = read_alpha_and_gray(path)
    notes = []
    if gray and channels == 3:
        result = (result * torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)).sum(0, keepdim=True)
        notes.append("grayscale: upscaled as RGB, written as luma")
    if alpha is not None:
        unit = torch.from_numpy(alpha).float()[None, None] / 255.0
        up = torch.nn.functional.interpolate(unit, scale_factor=scale, mode="bicubic", align_corners=False)
        result = torch.cat([result, up[0].clamp(0, 1)], 0)
        notes.append("alpha: upscaled bicubically")
    return result, "; ".join(notes)


def whole_image_bytes(upscaler: Upscaler, height: int, width: int) -> int:
    """An estimate of the memory a whole ``height`` x ``width`` image needs: the largest output of
    any layer on a 16x16 probe, scaled by the pixels, three times (that output, its input and one
    more beside it, as a concatenation or a residual holds), float32."""
    return 3 * 4 * upscaler.largest_probe_output * height * width // 256


def check_whole_image_fits(upscaler: Upscaler, size: Sequence[int], path: Path) -> None:
    """Refuse, before any work, an image whose whole-image upscaling needs more memory than is free.

    Raises:
        ConfigError: naming the image, the memory it needs, what is free, and ``--tile``.
    """
    import psutil

    needed, free = whole_image_bytes(upscaler, *size), psutil.virtual_memory().available
    if needed > free:
        raise ConfigError(
            f"{path}: upscaling this {size[0]}x{size[1]} image whole needs about {_amount(needed)}, "
            f"{_amount(free)} are free; pass --tile 256 (tiles equal the whole output)"
        )


def _amount(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"
