"""Reading a decathlon-style ``dataset.json``: every field upzoo uses is checked where it enters,
and paths must stay inside the dataset folder unless the recipe allows otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from upzoo.checks import check_spacing
from upzoo.errors import DataError

__all__ = ["read_dataset_json", "resolve_inside"]


def resolve_inside(root: Path, entry: Any, where: str, *, allow_outside: bool) -> Path:
    """``root / entry``; a path that leaves ``root`` (absolute, ``../``) only with ``allow_outside``.

    Raises:
        DataError: not a path string, or a path outside the root.
    """
    if not isinstance(entry, str) or not entry:
        raise DataError(f"{where}: expected a file path (string), got {entry!r}")
    path = (root / entry).resolve()
    if not allow_outside and not path.is_relative_to(root.resolve()):
        raise DataError(
            f"{where}: {entry!r} points outside the dataset folder {root}; move the file into it or set "
            f"data.allow_outside_root: true"
        )
    return path


def _check_labels(labels: Any, listing: Path) -> list[str] | None:
    if labels is None:
        return None
    if not isinstance(labels, dict) or not labels:
        raise DataError(
            f'{listing}: \'labels\' must map class indices to names, e.g. {{"0": "background"}}, got {labels!r}'
        )
    try:
        indices = sorted(int(k) for k in labels)
    except ValueError:
        raise DataError(f"{listing}: 'labels' keys must be class indices 0, 1, ..., got {sorted(labels)!r}") from None
    if indices != list(range(len(indices))):
        raise DataError(f"{listing}: 'labels' keys must be 0..{len(indices) - 1} without gaps, got {indices}")
    return [str(labels[k]) for k in sorted(labels, key=int)]


def _check_spacing(spacing: Any, listing: Path) -> tuple[float, ...] | None:
    if spacing is None:
        return None
    return check_spacing(spacing, f"{listing}: 'spacing'", error=DataError)


def read_dataset_json(listing: Path) -> dict[str, Any]:
    """The checked description: ``training`` (list of ``{"image", "label"}``), ``test`` (list),
    ``labels`` (class names or ``None``), ``spacing`` (or ``None``), ``validation_count`` (or ``None``).

    Raises:
        DataError: unreadable or invalid JSON, or a field of the wrong form; naming the file and field.
    """
    try:
        meta = json.loads(listing.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise DataError(f"{listing}: not UTF-8 JSON text") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{listing}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
    except OSError as exc:
        raise DataError(f"{listing}: unreadable ({exc.strerror or exc})") from None
    if not isinstance(meta, dict):
        raise DataError(f"{listing}: expected a JSON object with a 'training' list, got a {type(meta).__name__}")
    training, test = meta.get("training", []), meta.get("test", [])
    if not isinstance(training, list) or not isinstance(test, list):
        raise DataError(f"{listing}: 'training' and 'test' must be lists")
    for entry in training:
        if not isinstance(entry, dict) or "image" not in entry or "label" not in entry:
            raise DataError(f"{listing}: every 'training' entry needs 'image' and 'label', got {entry!r}")
    count = meta.get("validation_count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
        raise DataError(f"{listing}: 'validation_count' must be a whole number, got {count!r}")
    return {
        "training": training,
        "test": test,
        "labels": _check_labels(meta.get("labels"), listing),
        "spacing": _check_spacing(meta.get("spacing"), listing),
        "validation_count": count,
    }
