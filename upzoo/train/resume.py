"""Continuing a run: the recipe a run folder continues with (its own model and data; the train and
eval sections may change, e.g. to train longer)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from upzoo.errors import ConfigError, TrainingError
from upzoo.recipe import Recipe, apply_overrides, parse_recipe
from upzoo.runs.checkpoint import load_checkpoint, load_weights
from upzoo.runs.identity import first_difference
from upzoo.runtime import restore_rng_state
from upzoo.yaml_files import read_yaml_file

__all__ = ["resume_recipe", "check_unchanged_recipe", "restore_run"]


def _stored_recipe(run_dir: Path) -> dict:
    path = run_dir / "recipe.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no recipe.yaml: is it an upzoo run folder?")
    stored = read_yaml_file(path, "run recipe")
    missing = [s for s in ("model", "data") if not isinstance(stored, dict) or not isinstance(stored.get(s), dict)]
    if missing:
        raise ConfigError(
            f"{path} has no {missing[0]!r} section: it was not written by upzoo train, or was edited; start a new run"
        )
    return stored


def resume_recipe(run_dir: str | Path, recipe: str | Path | None = None, overrides: Sequence[str] = ()) -> Recipe:
    """The recipe to continue ``run_dir`` with: its stored model and data, and the train/eval
    sections of ``recipe`` (or the stored ones) with ``--set`` overrides.

    Raises:
        ConfigError: not a run folder, an unreadable stored recipe, or a change to the model or data.
    """
    run_dir = Path(run_dir)
    stored = _stored_recipe(run_dir)
    given = read_yaml_file(recipe) if recipe is not None else stored
    given = apply_overrides(given, overrides)
    difference = first_difference(stored, parse_recipe(given, source=str(recipe) if recipe else None).to_dict(),
                                  ("model", "data"))  # fmt: skip
    if difference is not None:
        raise ConfigError(
            f"resuming {run_dir} cannot change {difference.split(':')[0]} ({difference}); only train and eval "
            f"settings may change, or start a new run"
        )
    effective = {**given, "model": stored["model"], "data": stored["data"]}
    return parse_recipe(effective, source=str(run_dir / "recipe.yaml"))


def check_unchanged_recipe(state: dict, resumed: dict, checkpoint: Path) -> None:
    """Refuse to continue a checkpoint with another model or data than it was trained with (an
    edited ``recipe.yaml``): the weights may fit and still mean something else.

    Raises:
        TrainingError: naming the first key that differs and both values.
    """
    saved = {"model": state.get("model_spec"), "data": (state.get("recipe") or {}).get("data")}
    sections = [s for s in ("model", "data") if isinstance(saved[s], dict)]  # old checkpoints may lack one
    difference = first_difference(saved, resumed, sections)
    if difference is not None:
        raise TrainingError(
            f"{checkpoint} was trained with another {difference.split('.')[0]} than the run's recipe.yaml now holds "
            f"({difference}); only train and eval settings may change on --resume: undo the edit or start a new run"
        )


def restore_run(trainer: Any) -> None:
    """Put a :class:`~upzoo.train.engine.Trainer` back where ``RUN/last.pt`` left it: the same run
    (its identity) of the same recipe (model and data), modules, optimisers, schedulers, scaler,
    step, best metric and random state; ``metrics.csv`` cut back to that step."""
    path = trainer.run.path / "last.pt"
    state = load_checkpoint(path, kind=trainer.task.kind, purpose=f"resuming a {trainer.task.kind} run")
    if trainer.ctx.is_main:
        trainer.run.check_checkpoint_identity(state)
    check_unchanged_recipe(state, {**trainer.recipe.to_dict(), "model": trainer.task.prepared.model_dict()}, path)
    for name, module in trainer.task.modules.items():
        load_weights(
            module, state[name], path, saved_spec=state["model_spec"], expected_spec=trainer.task.prepared.model_dict()
        )
    for name, optimizer in trainer.optimizers.items():
        optimizer.load_state_dict(state["optimizers"][name])
        trainer.schedulers[name].load_state_dict(state["schedulers"][name])
    if trainer.scaler is not None and state.get("scaler"):
        trainer.scaler.load_state_dict(state["scaler"])
    trainer.run_id, trainer.step, trainer.best = state["run_id"], state["step"], state["best_metric"]
    trainer.epoch = trainer.step // trainer.steps_per_epoch
    restore_rng_state(state["rng"])
    if trainer.ctx.is_main:
        trainer.run.truncate_metrics(trainer.step)
