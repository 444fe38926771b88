"""What a run folder holds for a given resolved recipe: nothing yet (``new``), an interrupted or
cut-short run of it (``resume``), or a finished one (``done``, with its summary). A folder holding
a run of another recipe is refused. ``upzoo train --continue``, ``bench compare`` and every
launcher decide with this one rule, so a cell can be requeued, killed or re-launched safely."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from upzoo.errors import ConfigError
from upzoo.runs.identity import first_difference, is_finished

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
    difference = first_difference(read_yaml_file(recipe, "run recipe"), expected_recipe(prepared))
    if difference is not None:
        raise ConfigError(f"{folder} holds a run of another recipe ({difference}); move it away or use another folder")
    try:
        done = json.loads(summary.read_text()) if summary.is_file() else None
    except (OSError, ValueError):
        done = None  # a summary cut short: the run is continued from last.pt and writes it again
    if not is_finished(done):
        return "resume", None
    if isinstance(done.get("val"), dict):  # older summaries hold inf (a missed class) as null; metrics.csv keeps it
        missing = {k: v for k, v in _last_evaluation(folder / "metrics.csv").items() if done["val"].get(k) is None}
        done["val"].update(missing)
    return "done", done


def _last_evaluation(path: Path) -> dict[str, float]:
    """The ``val_*`` values of the last evaluation row of ``metrics.csv`` (where inf stays inf)."""
    import csv

    if not path.is_file():
        return {}
    with open(path, newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("val_miou")]
    last = rows[-1] if rows else {}
    return {key[4:]: float(value) for key, value in last.items() if key.startswith("val_") and value}
