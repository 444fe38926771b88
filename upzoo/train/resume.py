"""Continuing a run: the recipe a run folder continues with (its own model and data; the train and
eval sections may change, e.g. to train longer). A changed key takes effect from the resumed step
(the optimiser's learning rate, weight decay, betas and momentum included) and the run folder's
recipe of record follows it, with the change logged in ``run.json``; ``train.optimizer`` and
``train.seed`` cannot change (the saved moments and random state belong to the old ones)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from upzoo.errors import ConfigError, TrainingError
from upzoo.recipe import Recipe, apply_overrides, parse_recipe
from upzoo.runs.checkpoint import load_checkpoint, load_weights
from upzoo.runs.identity import differences, first_difference
from upzoo.runtime import restore_rng_state
from upzoo.yaml_files import read_yaml_file

__all__ = [
    "resume_recipe",
    "check_resumable_changes",
    "apply_optimizer_settings",
    "record_recipe_changes",
    "check_unchanged_recipe",
    "restore_run",
]


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
        ConfigError: not a run folder, an unreadable stored recipe, a change to the model or data, or
            to ``train.optimizer`` or ``train.seed``.
    """
    run_dir = Path(run_dir)
    stored = _stored_recipe(run_dir)
    given = read_yaml_file(recipe) if recipe is not None else stored
    given = apply_overrides(given, overrides)
    parsed = parse_recipe(given, source=str(recipe) if recipe else None)
    difference = first_difference(stored, _resolved(parsed), ("model", "data"))
    if difference is not None:
        raise ConfigError(
            f"resuming {run_dir} cannot change {difference.split(':')[0]} ({difference}); only train and eval "
            f"settings may change, or start a new run"
        )
    check_resumable_changes(stored.get("train") or {}, parsed.train)
    effective = {**given, "model": stored["model"], "data": stored["data"]}
    return parse_recipe(effective, source=str(run_dir / "recipe.yaml"))


def _resolved(recipe: Recipe) -> dict[str, Any]:
    """The recipe as a run of it records it: ``strides: auto`` planned (so a change of channels shows)."""
    from upzoo.prepare import resolve_model

    model = resolve_model(recipe) if recipe.model.options.get("strides") == "auto" else recipe.model
    return {**recipe.to_dict(), "model": model.to_dict()}


FIXED_ON_RESUME = {
    "optimizer": "the saved optimiser state (its moments or momentum) belongs to the old optimiser",
    "seed": "the run's random state continues from the checkpoint",
}


def check_resumable_changes(saved_train: dict[str, Any], train: Any) -> None:
    """Refuse a change of a train key that a resumed run cannot honour.

    Raises:
        ConfigError: ``train.optimizer`` or ``train.seed`` changed, naming both values and the way out.
    """
    for key, why in FIXED_ON_RESUME.items():
        if key in saved_train and saved_train[key] != getattr(train, key):
            raise ConfigError(
                f"train.{key} cannot change on --resume ({saved_train[key]!r} there, {getattr(train, key)!r} "
                f"here): {why}; keep {saved_train[key]!r}, or start a new run"
            )


def apply_optimizer_settings(trainer: Any) -> None:
    """The recipe's learning rate, weight decay, betas and momentum into every loaded optimiser
    (``load_state_dict`` brings back the saved ones), the learning rate at the resumed step of the
    recipe's schedule."""
    cfg = trainer.cfg
    for name, optimizer in trainer.optimizers.items():
        scheduler = trainer.schedulers[name]
        scheduler.base_lrs = [cfg.lr for _ in optimizer.param_groups]
        factors = [factor(scheduler.last_epoch) for factor in scheduler.lr_lambdas]
        for group, factor in zip(optimizer.param_groups, factors):
            group.update(initial_lr=cfg.lr, lr=cfg.lr * factor, weight_decay=cfg.weight_decay)
            if cfg.optimizer == "sgd":
                group.update(momentum=cfg.momentum, nesterov=cfg.momentum > 0)
            else:
                group["betas"] = tuple(cfg.betas)
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def record_recipe_changes(trainer: Any, step: int) -> list[str]:
    """Rewrite the run folder's ``recipe.yaml`` (and its digest in ``run.json``) to the recipe the
    run continues with, adding the changes to ``run.json``'s history and saying them on stderr;
    the changes (none: nothing written)."""
    resolved = {**trainer.recipe.to_dict(), "model": trainer.task.prepared.model_dict()}
    stored = read_yaml_file(trainer.run.path / "recipe.yaml", "run recipe")
    changes = differences(stored, resolved, ("train", "eval"))
    if changes:
        trainer.run.record_recipe_change(resolved, step, changes)
        print(f"resuming {trainer.run.path} at step {step} with: " + "; ".join(changes), file=sys.stderr)
    return changes


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
    check_resumable_changes((state.get("recipe") or {}).get("train") or {}, trainer.cfg)
    for name, optimizer in trainer.optimizers.items():
        optimizer.load_state_dict(state["optimizers"][name])
        trainer.schedulers[name].load_state_dict(state["schedulers"][name])
    apply_optimizer_settings(trainer)
    if trainer.scaler is not None and state.get("scaler"):
        trainer.scaler.load_state_dict(state["scaler"])
    trainer.run_id, trainer.step, trainer.best = state["run_id"], state["step"], state["best_metric"]
    trainer.epoch = trainer.step // trainer.steps_per_epoch
    restore_rng_state(state["rng"])
    if trainer.ctx.is_main:
        trainer.run.truncate_metrics(trainer.step)
        record_recipe_changes(trainer, trainer.step)
