"""What a run folder holds for a given resolved recipe: nothing yet (``new``), an interrupted or
cut-short run of it (``resume``), or a finished one (``done``, with its summary). A folder holding
a run of another recipe is refused. ``upzoo train --continue``, ``bench compare`` and every
launcher decide with this one rule, so a cell can be requeued, killed or re-launched safely."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from upzoo.errors import ConfigError

__all__ = ["run_state", "expected_recipe"]

State = Literal["new", "resume", "done"]


def expected_recipe(prepared: Any) -> dict[str, Any]:
    """The resolved recipe a run of ``prepared`` writes to its ``recipe.yaml`` (plain data)."""
    from upzoo.recipe import plain

    return plain({**prepared.recipe.to_dict(), "model": prepared.model_dict()})


def run_state(folder: str | Path, prepared: Any) -> tuple[State, dict[str, Any] | None]:
    """What ``folder`` holds for this cell: ``("done", summary)`` — a training of the same recipe
    finished there (so an interrupted ``bench compare`` continues where it stopped) —,
    ``("resume", None)`` — one that was interrupted —, or ``("new", None)``.

    Raises:
        ConfigError: the folder holds a run of another recipe, or a damaged one; naming it.
    """
    from upzoo.yaml_files import read_yaml_file

    folder = Path(folder)
    summary, recipe = folder / "summary.json", folder / "recipe.yaml"
    if not recipe.is_file() or not (folder / "last.pt").is_file():
        return "new", None
    expected, stored = expected_recipe(prepared), read_yaml_file(recipe, "run recipe")
    if stored != expected:
        raise ConfigError(f"{folder} holds a run of another recipe ({_first_difference(stored, expected)}); move it "
                          f"away or use another folder")  # fmt: skip
    try:
        done = json.loads(summary.read_text()) if summary.is_file() else None
    except (OSError, ValueError):
        done = None  # a summary cut short: the run is continued from last.pt and writes it again
    finished = isinstance(done, dict) and not done.get("interrupted") and done.get("steps") == done.get("total_steps")
    if not finished:
        return "resume", None
    if isinstance(done.get("val"), dict):  # older summaries hold inf (a missed class) as null; metrics.csv keeps it
        missing = {k: v for k, v in _last_evaluation(folder / "metrics.csv").items() if done["val"].get(k) is None}
        done["val"].update(missing)
    return "done", done


def _first_difference(stored: Any, expected: dict[str, Any]) -> str:
    """``train.lr: 0.5 there, 0.01 here`` for the first key that differs."""
    if not isinstance(stored, dict):
        return "its recipe.yaml is not a mapping"
    for section in ("model", "data", "train", "eval"):
        theirs, ours = stored.get(section) or {}, expected.get(section) or {}
        if theirs != ours:
            key = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))[0]
            return f"{section}.{key}: {theirs.get(key)!r} there, {ours.get(key)!r} here"
    return "sections differ"


def _last_evaluation(path: Path) -> dict[str, float]:
    """The ``val_*`` values of the last evaluation row of ``metrics.csv`` (where inf stays inf)."""
    import csv

    if not path.is_file():
        return {}
    with open(path, newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("val_miou")]
    last = rows[-1] if rows else {}
    return {key[4:]: float(value) for key, value in last.items() if key.startswith("val_") and value}
