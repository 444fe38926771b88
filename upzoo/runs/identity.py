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

__all__ = ["canonical", "differences", "first_difference", "is_finished", "recipe_digest", "SECTIONS"]

SECTIONS = ("model", "data", "train", "eval")


def canonical(value: Any) -> str:
    """The one form in which recipe values are compared and hashed: JSON with keys sorted, so ``1``
    and ``1.0`` (or ``True`` and ``1``) differ for the digest and for the comparison alike, and a
    tuple equals the list YAML reads back."""
    return json.dumps(value, sort_keys=True, default=str)


def differences(stored: Any, expected: dict[str, Any], sections: Sequence[str] = SECTIONS) -> list[str]:
    """``"train.lr: 0.5 there, 0.01 here"`` for every key (sections in order, keys sorted) whose
    value differs (:func:`canonical`) between a stored recipe and the expected one. An expected
    ``model.strides: auto`` matches the strides the run planned from it and the channels of as
    many stages (the planner keeps the first ``len(strides) + 1``).

    >>> differences({"train": {"lr": 0.5, "seed": 1}}, {"train": {"lr": 0.01, "seed": 1.0}}, ["train"])
    ['train.lr: 0.5 there, 0.01 here', 'train.seed: 1 there, 1.0 here']
    """
    if not isinstance(stored, dict):
        return ["its recipe is not a mapping"]
    found = []
    for section in sections:
        theirs, ours = stored.get(section) or {}, expected.get(section) or {}
        if not isinstance(theirs, dict):
            return [*found, f"its {section} section is not a mapping"]
        if section == "model" and ours.get("strides") == "auto":  # planned at the start of the run
            ours = _as_planned(ours, theirs)
        for key in sorted(set(theirs) | set(ours)):
            if canonical(theirs.get(key)) != canonical(ours.get(key)):
                found.append(f"{section}.{key}: {theirs.get(key)!r} there, {ours.get(key)!r} here")
    return found


def _as_planned(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """An expected model with ``strides: auto`` as the run planned it: its strides, and the expected
    channels cut to as many stages (a change of channels is a difference, not hidden)."""
    strides = theirs.get("strides")
    channels = ours.get("channels")
    if isinstance(strides, list) and isinstance(channels, (list, tuple)):
        channels = list(channels)[: len(strides) + 1]
    elif channels is None:
        channels = theirs.get("channels")  # the architecture's default, as the run planned it
    return {**ours, "strides": strides, "channels": channels}


def first_difference(stored: Any, expected: dict[str, Any], sections: Sequence[str] = SECTIONS) -> str | None:
    """The first of :func:`differences`, or ``None`` when ``sections`` agree.

    >>> first_difference({"train": {"lr": 0.5}}, {"train": {"lr": 0.01}}, ["train"])
    'train.lr: 0.5 there, 0.01 here'
    """
    found = differences(stored, expected, sections)
    return found[0] if found else None


def recipe_digest(recipe: dict[str, Any], sections: Sequence[str] = SECTIONS) -> str:
    """SHA-256 of a resolved recipe's ``sections`` in :func:`canonical` form: stored in a run's
    ``run.json`` and in its exports' contract, so two runs or files of one recipe show one digest,
    and two recipes with no :func:`differences` have one digest.

    >>> recipe_digest({"train": {"lr": 0.01}}) == recipe_digest({"train": {"lr": 0.01}, "notes": 1})
    True
    """
    present = {s: {k: v for k, v in (recipe.get(s) or {}).items() if v is not None} for s in sections}
    return hashlib.sha256(canonical(present).encode()).hexdigest()  # an absent key reads as None, as there


def is_finished(summary: Any) -> bool:
    """Whether a run's ``summary.json`` (parsed) says it trained all its steps and was evaluated:
    not interrupted, ``steps == total_steps``, a ``val`` mapping."""
    return (
        isinstance(summary, dict)
        and not summary.get("interrupted")
        and summary.get("steps") == summary.get("total_steps")
        and isinstance(summary.get("val"), dict)
    )
