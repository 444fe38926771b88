"""What the training loop watches: non-finite losses and parameters (stop, naming the step and the
checkpoint that is still good) and throughput."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from upzoo.errors import TrainingError

__all__ = ["check_finite", "check_finite_parameters", "Throughput", "StartEstimate", "say"]


def check_finite(value: float, step: int, what: str, run_dir: Path) -> None:
    """Stop the run on a NaN/inf loss, naming the step and the checkpoint that is still good."""
    if not math.isfinite(value):
        last = run_dir / "last.pt"
        keep = f"the last good checkpoint {last} is kept" if last.exists() else "no checkpoint was written yet"
        raise TrainingError(
            f"{what} became {value} at step {step}; stopped, {keep}. Lower train.lr or enable grad_clip"
        )


def check_finite_parameters(modules: Iterable[torch.nn.Module], step: int, run_dir: Path) -> None:
    """Refuse to checkpoint a model whose parameters or buffers (e.g. BatchNorm statistics)
    overflowed; the last good checkpoint stays."""
    for module in modules:
        for name, t in module.state_dict().items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                check_finite(float("nan"), step, f"parameter {name}", run_dir)


class Throughput:
    """Samples per second over a sliding window of steps."""

    def __init__(self, window: int = 20) -> None:
        self.window, self.marks = window, []

    def tick(self, samples: int) -> float:
        self.marks.append((time.perf_counter(), samples))
        self.marks = self.marks[-self.window :]
        if len(self.marks) < 2:
            return float("nan")
        elapsed = self.marks[-1][0] - self.marks[0][0]
        return sum(s for _, s in self.marks[1:]) / elapsed if elapsed > 0 else float("nan")


class StartEstimate:
    """The run's own estimate of the time it needs, said once after its first ``after`` steps (the
    first step, which warms up, left out): ms per step on this machine and the minutes for the steps
    left, evaluations not counted."""

    def __init__(self, start_step: int, total_steps: int, after: int = 10, clock: Any = time.perf_counter) -> None:
        self.start, self.total, self.after, self.clock = start_step, total_steps, after, clock
        self.first: float | None = None
        self.said = False

    def tick(self, step: int) -> str | None:
        """The estimate at the step that completes the first ``after`` (None at every other)."""
        if self.said:
            return None
        if step == self.start + 1:
            self.first = self.clock()
            return None
        if self.first is None or step < self.start + 1 + self.after or step >= self.total:
            return None
        self.said = True
        per_step = (self.clock() - self.first) / (step - self.start - 1)
        left = self.total - step
        return (
            f"{per_step * 1e3:.0f} ms per step here: about {max(1, round(left * per_step / 60))} min for the "
            f"{left:,} steps left (evaluations not counted)"
        )


def say(line: str, bar: Any = None) -> None:
    """A line on stderr, above the progress bar when there is one."""
    if bar is not None:
        bar.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)
