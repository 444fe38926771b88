"""The base of every metric that accumulates batch by batch: its states are declared once, so
``reset`` and the sync across DistributedDataParallel ranks are written here for all of them.

A state is one of two kinds:

- ``"sum"``: a tensor that ranks add up (counts, sums of values). Declared with its zero value; a
  state whose shape only the first batch tells (a spectrum's rings) is declared ``None`` and
  gathered, then added, when it is synced.
- ``"cat"``: a list of tensors whose rows every rank contributes (per-image values, features, patch
  descriptors); after the sync each rank holds every rank's rows, in rank order.

``update`` adds a batch, ``compute`` reads the states, ``reset`` returns to the declared defaults.
Across DistributedDataParallel ranks the contract is torchmetrics': ``compute`` syncs the states
(sums added, rows gathered), computes, and restores this rank's own states, so every rank must call
it; ``sync`` combines the ranks' states in place until ``unsync`` restores them (a second ``sync``
is a no-op, never a second sum), ``sync_context`` does both around a block, and ``update`` on a
synced metric is refused (it would add local data onto global totals). A metric that only one rank
computes (an evaluation on rank 0) is built with ``sync_on_compute=False``. In a single process
every sync is a no-op. The collectives run on the device the process group reduces on and the
states stay where they live (:mod:`upzoo.collectives`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

    sync_attributes: tuple[str, ...] = ()  # attributes besides the states that sync changes (restored by unsync)

    def __init__(self, *, sync_on_compute: bool = True) -> None:
        self._defaults: dict[str, tuple[torch.Tensor | None, Reduction]] = {}
        self.sync_on_compute = sync_on_compute
        self._local: dict[str, Any] | None = None  # this rank's own states while synced

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every subclass's ``compute`` syncs around itself and its ``update`` refuses a synced
        metric, as torchmetrics wraps them."""
        super().__init_subclass__(**kwargs)
        if "compute" in cls.__dict__:
            cls.compute = _syncing_compute(cls.__dict__["compute"])
        if "update" in cls.__dict__:
            cls.update = _local_update(cls.__dict__["update"])

    @property
    def synced(self) -> bool:
        """Whether the states hold every rank's data (after :meth:`sync`, before :meth:`unsync`)."""
        return self._local is not None

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
        """Every state back to its declared default (the options stay; a synced metric is local again)."""
        self._local = None
        for name in self._defaults:
            setattr(self, name, self._fresh(name))

    def sync(self) -> None:
        """Combine every rank's states (sums added, rows gathered in rank order), in place, keeping
        this rank's own for :meth:`unsync`. Every rank must call it; a no-op in a single process and
        on a metric already synced."""
        if self.synced or not distributed_active():
            return
        names = (*self._defaults, *self.sync_attributes)
        self._local = {name: _copied(getattr(self, name)) for name in names}
        self._combine()

    def unsync(self) -> None:
        """This rank's own states back, as before :meth:`sync` (a no-op when not synced)."""
        if self._local is None:
            return
        for name, value in self._local.items():
            setattr(self, name, value)
        self._local = None

    @contextmanager
    def sync_context(self) -> Iterator[None]:
        """The ranks' combined states inside the block, this rank's own after it (left synced if it
        was synced before)."""
        was_synced = self.synced
        self.sync()
        try:
            yield
        finally:
            if not was_synced:
                self.unsync()

    def _combine(self) -> None:
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


def _copied(value: Any) -> Any:
    """A copy of a state that the sync will not touch (tensors cloned, lists copied)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    return list(value) if isinstance(value, list) else value


def _syncing_compute(compute: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(compute)
    def wrapped(self: StreamingMetric, *args: Any, **kwargs: Any) -> Any:
        if not self.sync_on_compute or self.synced:
            return compute(self, *args, **kwargs)
        with self.sync_context():
            return compute(self, *args, **kwargs)

    return wrapped


def _local_update(update: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(update)
    def wrapped(self: StreamingMetric, *args: Any, **kwargs: Any) -> Any:
        if self.synced:
            raise ConfigError(
                f"{type(self).__name__}.update() on a synced metric would add this rank's batch to every rank's "
                "totals: call unsync() first, or let compute() sync (it restores the local states)"
            )
        return update(self, *args, **kwargs)

    return wrapped


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
