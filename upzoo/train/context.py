"""What a task sees of the training engine while it runs a step or an evaluation: the optimisation
surface and a few facts about the run — never the engine itself, so tasks and engine do not import
each other (mmengine's ``OptimWrapper`` idea)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from upzoo.runtime import autocast
from upzoo.train.distributed import DistContext

__all__ = ["StepContext", "EngineContext"]


class StepContext(Protocol):
    """The narrow interface :class:`~upzoo.train.engine.Trainer` gives tasks.

    ``device``: where tensors go; ``amp``: the recipe's autocast mode; ``dist``: the DDP context
    (rank, world size) for evaluations that sum across ranks; ``run_path``: the run folder; ``step``:
    the number of steps done; ``is_main``: whether this rank writes files.
    """

    device: torch.device
    amp: str
    dist: DistContext
    run_path: Path
    step: int
    is_main: bool

    def net(self, name: str) -> nn.Module:
        """Module ``name`` to call in a training step (DDP-wrapped under torchrun)."""

    def autocast(self) -> contextlib.AbstractContextManager:
        """The recipe's mixed precision for this device."""

    def to_device(self, tensor: torch.Tensor, *, image: bool = False) -> torch.Tensor:
        """``tensor`` on the device (images in the run's memory format)."""

    def optimize(self, loss: torch.Tensor, name: str) -> float:
        """One update of module ``name`` from ``loss``; returns the loss value."""


class EngineContext:
    """:class:`StepContext` as the engine implements it (a base of
    :class:`~upzoo.train.engine.Trainer`), read from the trainer's ``cfg``, ``ctx``, ``run``,
    ``device``, ``channels_last`` and its modules as called in a step, ``_wrapped``."""

    @property
    def amp(self) -> str:
        return self.cfg.amp

    @property
    def dist(self) -> DistContext:
        return self.ctx

    @property
    def run_path(self) -> Path:
        return self.run.path

    @property
    def is_main(self) -> bool:
        return self.ctx.is_main

    def net(self, name: str) -> nn.Module:
        """The module to call in a training step (DDP-wrapped under torchrun)."""
        return self._wrapped[name]

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.cfg.amp, self.device)

    def to_device(self, tensor: torch.Tensor, *, image: bool = False) -> torch.Tensor:
        tensor = tensor.to(self.device, non_blocking=True)
        if image and self.channels_last is not None:
            tensor = tensor.contiguous(memory_format=self.channels_last)
        return tensor
