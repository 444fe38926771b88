"""A run's folder: one run per folder (a lock), the run's identity, its resolved recipe and its
metrics CSV. Train writes it; eval, predict, export and bench read it."""

from __future__ import annotations

import csv
import json
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from upzoo.errors import ConfigError, TrainingError
from upzoo.runs.identity import recipe_digest
from upzoo.runtime import FolderLock, atomic_write, remove_stale_temporaries

__all__ = ["RunFolder"]


class RunFolder:
    """A run's folder: ``recipe.yaml`` (resolved), ``run.json`` (the run's identity),
    ``metrics.csv`` (appended), checkpoints, PNGs.

    One run per folder: the writing process (``lock=True``, rank 0) holds an exclusive lock on
    ``.lock`` until :meth:`close` (or its exit), so a second run into the same folder stops at once;
    the lock file goes when the run does.
    A new run refuses a folder that already holds one; a resumed run needs one.

    Raises:
        ConfigError: the path is a file or cannot be created or written, the folder is in use,
            already holds a run (new) or holds none (resume).
    """

    def __init__(self, path: str | Path, columns: list[str], *, resume: bool = False, lock: bool = True) -> None:
        self.path = Path(path)
        self.columns = columns
        self._lock: FolderLock | None = None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise ConfigError(f"run folder {str(self.path)!r} is a file; give a folder path (--out)") from None
        except OSError as exc:
            raise ConfigError(f"cannot create run folder {str(self.path)!r}: {exc.strerror or exc}") from None
        if lock:
            self._lock = FolderLock(
                self.path,
                f"run folder {str(self.path)!r} is in use by another run; "
                "wait for it to finish or choose another --out",
                transient=True,  # a finished run folder keeps only what the run made
            )
            remove_stale_temporaries(self.path)
            self._check_state(resume)

    def _check_state(self, resume: bool) -> None:
        holds_run = (self.path / "last.pt").is_file()
        if not resume and not holds_run and (self.path / "recipe.yaml").exists():
            self._clear_unfinished_start()
        if resume and not holds_run:
            self.close()
            raise ConfigError(f"{self.path} holds no last.pt to resume from; start a new run instead")
        if not resume and holds_run:
            self.close()
            raise ConfigError(
                f"{self.path} already holds a run; continue it with --resume {self.path} or choose another --out"
            )

    def _clear_unfinished_start(self) -> None:
        """A run stopped before its first checkpoint (killed, crashed) left a recipe but nothing to
        resume: it is started again, and says so."""
        import warnings

        for name in ("run.json", "recipe.yaml", "metrics.csv", "summary.json"):
            (self.path / name).unlink(missing_ok=True)
        warnings.warn(
            f"{self.path} held a run that stopped before its first checkpoint; starting it again", stacklevel=3
        )

    def close(self) -> None:
        """Release the folder for other runs."""
        if self._lock is not None:
            self._lock.release()

    def __del__(self) -> None:
        self.close()

    def start_identity(self, recipe: dict[str, Any]) -> str:
        """A new run's id, written to ``run.json`` with the digest of its resolved ``recipe``
        (:func:`~upzoo.runs.identity.recipe_digest`); checkpoints carry the id."""
        run_id = uuid.uuid4().hex
        created = time.strftime("%Y-%m-%dT%H:%M:%S")
        identity = json.dumps({"run_id": run_id, "created": created, "recipe_sha256": recipe_digest(recipe)})
        atomic_write(self.path / "run.json", lambda tmp: tmp.write_text(identity))
        return run_id

    def identity(self) -> str:
        """The id of the run this folder holds (from ``run.json``).

        Raises:
            ConfigError: no readable ``run.json``.
        """
        try:
            return str(json.loads((self.path / "run.json").read_text())["run_id"])
        except (OSError, ValueError, KeyError, TypeError):
            raise ConfigError(
                f"{self.path} has no readable run.json (the run's identity); it was not written by "
                f"this version of upzoo train, so it cannot be resumed: start a new run"
            ) from None

    def check_checkpoint_identity(self, state: dict[str, Any], name: str = "last.pt") -> None:
        """Refuse a checkpoint that another run wrote (copied into this folder).

        Raises:
            TrainingError: naming both run ids.
        """
        own, theirs = self.identity(), state.get("run_id")
        if theirs != own:
            raise TrainingError(
                f"{self.path / name} belongs to run {theirs}, not to this folder's run {own} "
                f"(run.json); it was copied from another run folder: start a new run from it instead"
            )

    def record_recipe_change(self, recipe: dict[str, Any], step: int, changes: list[str]) -> None:
        """The folder's recipe of record becomes ``recipe`` (a run resumed at ``step`` with other
        train or eval settings): ``recipe.yaml`` rewritten, ``run.json``'s digest updated and the
        change added to its ``recipe_changes`` history (step, time, the keys with both values)."""
        path = self.path / "run.json"
        identity = json.loads(path.read_text())
        when = time.strftime("%Y-%m-%dT%H:%M:%S")
        history = [*identity.get("recipe_changes", []), {"step": step, "time": when, "changes": changes}]
        identity.update(recipe_sha256=recipe_digest(recipe), recipe_changes=history)
        self.write_recipe(recipe)
        atomic_write(path, lambda tmp: tmp.write_text(json.dumps(identity)))

    def write_recipe(self, recipe_dict: dict[str, Any]) -> None:
        text = yaml.safe_dump(recipe_dict, sort_keys=False)
        atomic_write(self.path / "recipe.yaml", lambda tmp: tmp.write_text(text))

    def log(self, row: dict[str, Any]) -> None:
        path = self.path / "metrics.csv"
        new = not path.exists()
        with open(path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})

    def truncate_metrics(self, step: int) -> None:
        """Drop metric rows after ``step`` (written after the checkpoint a resume starts from)."""
        path = self.path / "metrics.csv"
        if not path.exists():
            return
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) <= step]
        path.unlink()
        for row in rows:
            self.log(row)

    def read_metrics(self) -> list[dict[str, str]]:
        path = self.path / "metrics.csv"
        if not path.exists():
            return []
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
