"""``upscale_files``: a super-resolution run over many image files (``upzoo predict`` on an SR run):
``OUT/NAME.png`` at the input's bit depth, and ``predictions.csv``."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from upzoo.errors import DataError, UpzooError
from upzoo.inference.files import named_inputs
from upzoo.inference.run import planned_outputs
from upzoo.inference.tiled_upscaling import check_tiling, read_unit_image, tiled_output, write_unit_image
from upzoo.runs.trained_model import LoadedModel
from upzoo.runtime import FolderLock, atomic_write, autocast, terminate_as_interrupt

__all__ = ["upscale_files", "tiling", "write_csv"]


def tiling(loaded: LoadedModel, tile: int | None) -> tuple[int | None, int]:
    """``(tile, halo)`` for ``--tile`` (``None``: whole images), by the rule of ``upscale``
    (:func:`~upzoo.inference.tiled_upscaling.check_tiling`): the halo is the model's receptive radius.

    Raises:
        ConfigError: a tile that keeps no core inside the halo (``< 2 * radius + 1``).
    """
    if tile is None:
        return None, 0
    options = loaded.spec.options
    return check_tiling(loaded.model, options.get("in_channels", 3), options["scale"], tile, name="--tile")


def upscale_files(
    loaded: LoadedModel, inputs: Sequence[str | Path], out: Path, *, tile: int | None = None,
    device: torch.device | str = "cpu", amp: bool = False, overwrite: bool = False, keep_going: bool = False,
    progress: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Upscale every input image into ``out``; returns ``{written, failed, csv, seconds, tile, halo}``.

    Raises:
        DataError: an unreadable input (with ``keep_going`` listed in ``failed``), outputs that exist
            without ``overwrite``, collide, or an ``out`` that holds inputs. ConfigError: as :func:`tiling`.
    """
    start = time.perf_counter()
    tile, halo = tiling(loaded, tile)
    named = named_inputs(inputs, volumes=False, exclude=out)
    planned = planned_outputs(named, out, overwrite, lambda name: {"image": out / f"{name}.png"})
    lock = FolderLock(out, f"another upzoo predict is writing into {out}; wait for it or choose another --out",
                      name=".predict.lock", transient=True)  # fmt: skip
    with lock, terminate_as_interrupt():
        planned = planned_outputs(named, out, overwrite, lambda name: {"image": out / f"{name}.png"})
        rows, failed = _run(loaded, named, planned, tile, halo, torch.device(device), amp, keep_going, progress)
        write_csv(out / "predictions.csv", rows)
    return {"written": len(rows), "failed": failed, "csv": str(out / "predictions.csv"),
            "seconds": round(time.perf_counter() - start, 3), "tile": tile, "halo": halo}  # fmt: skip


def _run(loaded, named, planned, tile, halo, device, amp, keep_going, progress) -> tuple[list, list]:
    from tqdm import tqdm

    options = loaded.spec.options
    channels, scale = options.get("in_channels", 3), options["scale"]
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
        with autocast("bf16" if amp else "none", device, "--amp"):
            result = tiled_output(loaded.model, image, scale, tile, halo, device)
        write_unit_image(outputs["image"], result, bits)
        rows.append({"file": str(path), "output": str(outputs["image"]),
                     "input_size": f"{image.shape[1]}x{image.shape[2]}",
                     "output_size": f"{result.shape[1]}x{result.shape[2]}", "bits": bits,
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
