"""The one rule for a run's identity: whether the recipe a run folder holds is a given recipe (the
first key that differs, named), and whether the run finished. ``upzoo train --continue`` and every
launcher (:mod:`upzoo.runs.state`), ``upzoo train --resume`` (:mod:`upzoo.train.resume`) and
``upzoo bench collect`` (:mod:`upzoo.bench.collect`) decide with these two functions, so they
never judge one folder differently."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["first_difference", "is_finished", "recipe_digest", "SECTIONS"]

SECTIONS = ("model", "data", "train", "eval")


def first_difference(stored: Any, expected: dict[str, Any], sections: Sequence[str] = SECTIONS) -> str | None:
    """``"train.lr: 0.5 there, 0.01 here"`` for the first key (sections in order, keys sorted) whose
    value differs between a stored recipe and the expected one; ``None`` when ``sections`` agree.
    An expected ``model.strides: auto`` matches the strides and channels the run planned from it.

    >>> first_difference({"train": {"lr": 0.5}}, {"train": {"lr": 0.01}}, ["train"])
    'train.lr: 0.5 there, 0.01 here'
    """
    if not isinstance(stored, dict):
        return "its recipe is not a mapping"
    for section in sections:
        theirs, ours = stored.get(section) or {}, expected.get(section) or {}
        if not isinstance(theirs, dict):
            return f"its {section} section is not a mapping"
        if section == "model" and ours.get("strides") == "auto":  # planned at the start of the run
            ours = {**ours, "strides": theirs.get("strides"), "channels": theirs.get("channels")}
        if theirs != ours:
            key = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))[0]
            return f"{section}.{key}: {theirs.get(key)!r} there, {ours.get(key)!r} here"
    return None


def recipe_digest(recipe: dict[str, Any], sections: Sequence[str] = SECTIONS) -> str:
    """SHA-256 of a resolved recipe's ``sections`` (canonical JSON: keys sorted): stored in a run's
    ``run.json`` and in its exports' contract, so two runs or files of one recipe show one digest.

    >>> recipe_digest({"train": {"lr": 0.01}}) == recipe_digest({"train": {"lr": 0.01}, "notes": 1})
    True
    """
    canonical = json.dumps({s: recipe.get(s) for s in sections}, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def is_finished(summary: Any) -> bool:
    """Whether a run's ``summary.json`` (parsed) says it trained all its steps and was evaluated:
    not interrupted, ``steps == total_steps``, a ``val`` mapping."""
    return (
        isinstance(summary, dict)
        and not summary.get("interrupted")
        and summary.get("steps") == summary.get("total_steps")
        and isinstance(summary.get("val"), dict)
    )
