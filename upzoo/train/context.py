"""What a task sees of the training engine while it runs a step or an evaluation: the optimisation
surface and a few facts about the run — never the engine itself, so tasks and engine do not import
each other (mmengine's ``OptimWrapper`` idea)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from upzoo.train.distributed import DistContext

__all__ = ["StepContext"]


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
