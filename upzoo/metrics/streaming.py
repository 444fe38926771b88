"""The base of every metric that accumulates batch by batch: its states are declared once, so
``reset`` and the sync across DistributedDataParallel ranks are written here for all of them.

A state is one of two kinds:

- ``"sum"``: a tensor that ranks add up (counts, sums of values). Declared with its zero value; a
  state whose shape only the first batch tells (a spectrum's rings) is declared ``None`` and
  gathered, then added, when it is synced.
- ``"cat"``: a list of tensors whose rows every rank contributes (per-image values, features, patch
  descriptors); after the sync each rank holds every rank's rows, in rank order.

``update`` adds a batch, ``compute`` reads the states, ``sync`` combines the ranks' states (a no-op
in a single process; call it on every rank once, before ``compute``), ``reset`` returns to the
declared defaults. The collectives run on the device the process group reduces on and the states
stay where they live (:mod:`upzoo.collectives`).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch

from upzoo.collectives import all_gather_objects, all_reduce_sum, distributed_active
from upzoo.errors import ConfigError, ShapeError

__all__ = ["StreamingMetric"]

Reduction = Literal["sum", "cat"]


class StreamingMetric:
    """``update`` per batch, ``sync`` across ranks, ``compute`` at the end, ``reset`` to start over.

    Subclasses declare their states in ``__init__`` with :meth:`add_state` and read and write them
    as attributes.

    >>> class Total(StreamingMetric):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.add_state("total", torch.zeros(()), "sum")
    ...     def update(self, x):
    ...         self.total += x.sum()
    ...     def compute(self):
    ...         return float(self.total)
    >>> metric = Total()
    >>> metric.update(torch.ones(3)); metric.sync(); metric.compute()
    3.0
    >>> metric.reset(); metric.compute()
    0.0
    """

    def __init__(self) -> None:
        self._defaults: dict[str, tuple[torch.Tensor | None, Reduction]] = {}

    def add_state(self, name: str, default: torch.Tensor | None, reduction: Reduction) -> None:
        """Declare the state ``name``: a ``"sum"`` tensor starting at ``default`` (``None``: shaped by
        the first batch), or a ``"cat"`` list of tensors starting empty (``default`` must be ``None``).

        Raises:
            ConfigError: an unknown reduction, or a default that does not fit it.
        """
        if reduction not in ("sum", "cat"):
            raise ConfigError(f"state {name!r}: reduction must be 'sum' or 'cat', got {reduction!r}")
        if reduction == "cat" and default is not None:
            raise ConfigError(f"state {name!r}: a 'cat' state starts as an empty list; pass default=None")
        if default is not None and not isinstance(default, torch.Tensor):
            raise ConfigError(f"state {name!r}: default must be a tensor or None, got {type(default).__name__}")
        self._defaults[name] = (None if default is None else default.detach().clone(), reduction)
        setattr(self, name, self._fresh(name))

    def _fresh(self, name: str) -> Any:
        default, reduction = self._defaults[name]
        if reduction == "cat":
            return []
        return None if default is None else default.clone()

    @property
    def state_names(self) -> tuple[str, ...]:
        """The declared states, in the order they were declared."""
        return tuple(self._defaults)

    def reset(self) -> None:
        """Every state back to its declared default (the options stay)."""
        for name in self._defaults:
            setattr(self, name, self._fresh(name))

    def sync(self) -> None:
        """Combine every rank's states (sums added, rows gathered in rank order), in place; a no-op
        in a single process. Every rank must call it, and each only once per evaluation."""
        if not distributed_active():
            return
        for name, (default, reduction) in self._defaults.items():
            value = getattr(self, name)
            if reduction == "sum" and default is not None:
                all_reduce_sum(value)
            elif reduction == "sum":
                setattr(self, name, _gathered_sum(name, value))
            else:
                gathered = all_gather_objects([t.cpu() for t in value])
                device = value[0].device if value else torch.device("cpu")
                setattr(self, name, [t.to(device) for rows in gathered for t in rows])

    def all_reduce(self) -> None:
        """Deprecated name of :meth:`sync` (kept for a release)."""
        warnings.warn(
            f"{type(self).__name__}.all_reduce() is deprecated; call sync() (the same combination of ranks)",
            FutureWarning,
            stacklevel=2,
        )
        self.sync()

    def update(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - every subclass has its own
        """Add a batch to the states.

        Raises:
            NotImplementedError: a subclass that does not define it.
        """
        raise NotImplementedError

    def compute(self) -> Any:  # pragma: no cover - every subclass has its own
        """The metric from the states so far.

        Raises:
            NotImplementedError: a subclass that does not define it.
        """
        raise NotImplementedError


def _gathered_sum(name: str, value: torch.Tensor | None) -> torch.Tensor | None:
    """The sum over ranks of a state shaped by the first batch (``None`` on a rank that saw none).

    Raises:
        ShapeError: ranks whose states differ in shape (they measured different things).
    """
    parts = [v for v in all_gather_objects(None if value is None else value.cpu()) if v is not None]
    if not parts:
        return None
    shapes = sorted({tuple(p.shape) for p in parts})
    if len(shapes) > 1:
        raise ShapeError(
            f"state {name!r} has shape {shapes[0]} on one rank and {shapes[1]} on another: every rank must "
            f"measure inputs of one size"
        )
    return torch.stack(parts).sum(0).to(value.device if value is not None else torch.device("cpu"))
