"""Where a run's numbers go: ``metrics.csv`` always (it feeds the curves and a resume), TensorBoard
event files with ``train.loggers: [csv, tensorboard]``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from upzoo.errors import ConfigError

__all__ = ["TensorBoardLogger", "extra_loggers"]


class TensorBoardLogger:
    """Scalars to ``RUN/tensorboard/`` (``tensorboard --logdir RUN``); a resumed run drops the
    events written after the step it resumes from, as ``metrics.csv`` drops its rows."""

    def __init__(self, path: Path, *, resume_step: int | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "train.loggers 'tensorboard' needs the tensorboard package: pip install tensorboard "
                "(or pip install -e '.[dev]')"
            ) from None
        self.writer = SummaryWriter(str(path / "tensorboard"), purge_step=resume_step)

    def log(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        for key, value in row.items():
            if key not in ("step", "epoch") and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


def extra_loggers(names: Sequence[str], path: Path, *, resume_step: int | None) -> list[TensorBoardLogger]:
    """The loggers besides the CSV file that the recipe asks for."""
    return [TensorBoardLogger(path, resume_step=resume_step) for name in names if name == "tensorboard"]
