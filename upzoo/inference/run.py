"""``predict_files``: a trained model over many files — DataLoader workers read and prepare the
inputs, the model runs on batches of same-size images, a writer thread colours and saves the
outputs, so reading, computing and writing overlap. Ends with ``predictions.csv``."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from upzoo.data.loading import iterate_loader
from upzoo.errors import DataError, UpzooError
from upzoo.inference.files import InputFile, named_inputs, output_paths, read_input
from upzoo.inference.predictor import Prediction, Predictor, Preprocess
from upzoo.inference.writers import default_palette, write_image_prediction, write_volume_prediction
from upzoo.runtime import FolderLock, atomic_write, remove_stale_temporaries, terminate_as_interrupt

__all__ = ["PredictOptions", "predict_files", "planned_outputs"]


@dataclass
class PredictOptions:
    """Where and how ``predict_files`` writes (see ``upzoo predict --help``)."""

    out: Path
    overlay: bool = False
    probabilities: str | None = None  # "nifti" or "npz" (volumes), "npz" (images)
    batch_size: int = 4
    num_workers: int = 2
    keep_going: bool = False
    overwrite: bool = False
    progress: bool = True


@dataclass
class _Summary:
    rows: list[dict[str, Any]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


class _Reader(Dataset):
    """Reads and prepares one input per item in a worker; errors come back as one line."""

    def __init__(self, paths: Sequence[Path], preprocess: Preprocess) -> None:
        self.paths, self.preprocess = list(paths), preprocess

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        path = self.paths[index]
        try:
            item = read_input(path, volumes=self.preprocess.volumes, channels=self.preprocess.in_channels)
            # NumPy, not a tensor: pickled through the queue instead of shared by file descriptor, so a
            # SIGTERM to the parent cannot leave a worker's fd-sharing thread printing a traceback
            x = self.preprocess(item.array, item.spacing) if self.preprocess.volumes else self.preprocess(item.array)
            return {"input": item, "x": x.numpy(), "error": None}
        except UpzooError as exc:
            message = str(exc)
            return {"input": None, "path": path, "error": message if str(path) in message else f"{path}: {message}"}
        except Exception as exc:  # a reader or decoder failing in its own way: still one line, naming the file
            return {"input": None, "path": path, "error": f"{path}: {type(exc).__name__}: {exc}"}


def _as_is(item: Any) -> Any:
    return item


def planned_outputs(
    named: list[tuple[Path, str]], out: Path, overwrite: bool, paths_of: Callable[[str], dict[str, Path]]
) -> list[dict[str, Path]]:
    """Every input's outputs (``paths_of(name)``), refused up front (nothing is written then) if an
    input lies inside ``out``, two outputs share a path, or (without ``overwrite``) an output is
    already there."""
    resolved = out.resolve()
    for source, _ in named:
        if source.resolve().is_relative_to(resolved):
            raise DataError(
                f"--out {out} holds the input {source}; predictions must not be written among their inputs: "
                f"choose another --out"
            )
    planned = [paths_of(name) for _, name in named]
    seen: dict[Path, Path] = {}
    for (source, _), outputs in zip(named, planned):
        for target in outputs.values():
            if target in seen:
                raise DataError(
                    f"{seen[target]} and {source} would both write {target}; rename one, or predict them into "
                    f"separate --out folders (nothing was written)"
                )
            seen[target] = source
    if not overwrite:
        existing = [p for outputs in planned for p in outputs.values() if p.exists()]
        if existing:
            raise DataError(
                f"{existing[0]} already exists ({len(existing)} output files do); pass --overwrite to replace them "
                f"or choose another --out (nothing was written)"
            )
    return planned


def _planned_outputs(named: list[tuple[Path, str]], options: PredictOptions, volumes: bool) -> list[dict[str, Path]]:
    return planned_outputs(
        named,
        options.out,
        options.overwrite,
        lambda name: output_paths(name, options.out, volumes=volumes, **_kinds(options)),
    )


def _kinds(options: PredictOptions) -> dict[str, Any]:
    return {"overlay": options.overlay, "probabilities": options.probabilities}


def _check_spacing(item: InputFile, trained: tuple[float, ...] | None, resampled: bool) -> None:
    """Warn where a volume runs at a spacing other than the training one: without resampling
    (``--no-resample``) when it differs by more than 10 %, or a ``.npy`` file, which has none."""
    if trained is None:
        return
    if item.spacing is None:
        if resampled:
            warnings.warn(
                f"{item.path}: a .npy file carries no voxel spacing, so it runs as if at the training spacing "
                f"{tuple(trained)} mm; save it as NIfTI with its spacing to have it resampled",
                stacklevel=2,
            )
        return
    if not resampled and any(abs(a - b) > 0.1 * b for a, b in zip(item.spacing, trained)):
        warnings.warn(
            f"{item.path}: voxel spacing {tuple(item.spacing)} mm differs by more than 10 % from the training "
            f"spacing {tuple(trained)} mm and --no-resample runs it as it is; predictions may be poor",
            stacklevel=2,
        )


class _Writer:
    """Writes predictions on a background thread (PNG encoding and compression release the GIL),
    with at most a few batches waiting, so memory stays bounded."""

    def __init__(self, predictor: Predictor) -> None:
        loaded = predictor.loaded
        self.volumes = loaded.volumes
        self.names = loaded.class_names or [str(k) for k in range(loaded.num_classes or 0)]
        self.palette = loaded.palette if loaded.palette is not None else default_palette(len(self.names))
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending: list[Future] = []

    def submit(self, item: InputFile, prediction: Prediction, outputs: dict[str, Path]) -> None:
        if len(self.pending) >= 8:
            self.pending.pop(0).result()
        self.pending.append(self.pool.submit(self._write, item, prediction, outputs))

    def _write(self, item: InputFile, prediction: Prediction, outputs: dict[str, Path]) -> None:
        if self.volumes:
            write_volume_prediction(outputs, prediction.labels, item, prediction.probabilities)
            return
        write_image_prediction(outputs, prediction.labels, self.palette, item.array, prediction.probabilities)

    def present(self, labels: np.ndarray) -> str:
        found = np.flatnonzero(np.bincount(labels.ravel()))
        return " ".join(self.names[k] if k < len(self.names) else str(k) for k in found)

    def close(self) -> None:
        for future in self.pending:
            future.result()
        self.pool.shutdown()


def _run_batch(predictor: Predictor, batch: list[dict], planned, writer: _Writer, summary: _Summary) -> None:
    start = time.perf_counter()
    items = [entry["input"] for entry in batch]
    predictions = predictor.predict_batch(torch.stack([entry["x"] for entry in batch]), batch[0]["size"])
    seconds = (time.perf_counter() - start) / len(batch)
    for entry, item, prediction in zip(batch, items, predictions):
        outputs = planned[entry["index"]]
        writer.submit(item, prediction, outputs)
        summary.rows.append(
            {
                "file": str(item.path),
                "labels": str(outputs["labels"]),
                "shape": "x".join(str(s) for s in prediction.labels.shape),
                "seconds": round(seconds, 4),
                "classes_present": writer.present(prediction.labels),
            }
        )


def _source_size(entry: dict, volumes: bool) -> tuple[int, ...]:
    shape = entry["input"].array.shape
    return tuple(shape[-3:] if volumes else shape[:2])


def predict_files(predictor: Predictor, inputs: Sequence[str | Path], options: PredictOptions) -> dict[str, Any]:
    """Predict every input file into ``options.out``; returns ``{written, failed, csv, seconds}``.
    One predict writes into an ``--out`` at a time (a lock); ``predictions.csv`` keeps the rows of
    earlier runs into the same folder, with this run's rows replacing those of the outputs it rewrote.

    Raises:
        DataError: bad inputs (the first, naming the file; with ``keep_going`` they are listed in
            ``failed`` and the rest are written), outputs that exist without ``overwrite``, outputs that
            would collide, or an ``--out`` that holds inputs.
        ConfigError: another predict is writing into ``--out``.
    """
    start = time.perf_counter()
    volumes = predictor.loaded.volumes
    named = named_inputs(inputs, volumes=volumes, exclude=options.out)
    _planned_outputs(named, options, volumes)  # refused before the lock creates --out; again under it
    lock = FolderLock(
        options.out,
        f"another upzoo predict is writing into {options.out}; wait for it to finish or choose another --out",
        name=".predict.lock",
        transient=True,
    )
    with lock, terminate_as_interrupt():
        remove_stale_temporaries(options.out, recursive=True)  # left by a predict that was killed
        planned = _planned_outputs(named, options, volumes)
        summary = _predict_all(predictor, [path for path, _ in named], planned, options)
    return {
        "written": len(summary.rows),
        "failed": summary.failed,
        "csv": str(options.out / "predictions.csv"),
        "seconds": round(time.perf_counter() - start, 3),
    }


def _predict_all(predictor: Predictor, paths: list[Path], planned: list, options: PredictOptions) -> _Summary:
    from tqdm import tqdm

    volumes = predictor.loaded.volumes
    loader = DataLoader(_Reader(paths, predictor.preprocess), batch_size=None, num_workers=options.num_workers,
                        collate_fn=_as_is)  # fmt: skip
    writer, summary = _Writer(predictor), _Summary()
    batch_size = 1 if volumes else options.batch_size
    batch: list[dict] = []
    bar = tqdm(total=len(paths), desc="predict", unit="file", disable=not options.progress, leave=False)
    try:
        for index, entry in enumerate(iterate_loader(loader)):
            entry["index"] = index
            if entry.get("x") is not None:
                entry["x"] = torch.from_numpy(entry["x"])
            if entry["error"] is not None:
                if not options.keep_going:
                    raise DataError(entry["error"] + " (--keep-going skips such files)")
                summary.failed.append((str(paths[index]), entry["error"]))
            else:
                trained = predictor.loaded.spacing if volumes else None
                _check_spacing(entry["input"], trained, predictor.preprocess.spacing is not None)
                entry["size"] = _source_size(entry, volumes)  # a batch shares its input and output sizes
                same = batch and entry["x"].shape == batch[0]["x"].shape and entry["size"] == batch[0]["size"]
                if batch and (not same or len(batch) == batch_size):
                    _run_batch(predictor, batch, planned, writer, summary)
                    batch = []
                batch.append(entry)
            bar.update(1)
        if batch:
            _run_batch(predictor, batch, planned, writer, summary)
    finally:
        bar.close()  # before any error line: the bar must not share its line
        writer.close()
        _merge_csv(options.out / "predictions.csv", summary)
    return summary


_COLUMNS = ["file", "labels", "shape", "seconds", "classes_present"]


def _merge_csv(path: Path, summary: _Summary) -> None:
    """Rewrite ``predictions.csv`` atomically: earlier rows whose outputs this run did not rewrite,
    then this run's rows."""
    import csv

    rewritten = {row["labels"] for row in summary.rows}
    kept: list[dict[str, str]] = []
    if path.is_file():
        try:
            with open(path, newline="") as f:
                kept = [row for row in csv.DictReader(f) if row.get("labels") not in rewritten]
        except (OSError, csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"{path} is not a readable predictions.csv ({exc}); move it away and run again") from None

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=_COLUMNS, extrasaction="ignore", restval="")
            out.writeheader()
            out.writerows(kept + summary.rows)

    atomic_write(path, write)
