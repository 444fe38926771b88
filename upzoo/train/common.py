"""What both training loops share: seeding, devices, optimisers and schedules, mixed precision,
RNG state for exact resumes, the run folder, and graceful stops on Ctrl-C."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import random
import signal
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from upzoo.errors import ConfigError, TrainingError
from upzoo.runtime import FolderLock, atomic_write, remove_stale_temporaries

__all__ = [
    "seed_everything",
    "pick_device",
    "build_optimizer",
    "build_scheduler",
    "autocast",
    "needs_grad_scaler",
    "rng_state",
    "restore_rng_state",
    "RunFolder",
    "StopFlag",
    "Throughput",
    "check_finite",
    "check_finite_parameters",
]


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch (all devices); optionally require deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def pick_device(choice: str) -> torch.device:
    """``auto``: CUDA when available, else the CPU."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: Any) -> torch.optim.Optimizer:
    """SGD (Nesterov momentum when momentum > 0), AdamW or Adam from a :class:`~upzoo.recipe.TrainConfig`."""
    params = [p for p in params if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, nesterov=cfg.momentum > 0
        )
    betas = tuple(cfg.betas)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Any, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps``, then ``poly`` (power 0.9), ``cosine`` or ``constant``."""
    warmup = max(0, cfg.warmup_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if cfg.schedule == "poly":
            return (1 - progress) ** 0.9
        if cfg.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def autocast(amp: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bfloat16/float16 autocast (float16 only on CUDA), or nothing."""
    if amp == "none":
        return contextlib.nullcontext()
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError("train.amp 'fp16' needs CUDA; on the CPU use 'bf16'")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


def needs_grad_scaler(amp: str, device: torch.device) -> bool:
    return amp == "fp16" and device.type == "cuda"


def rng_state() -> dict[str, Any]:
    """Every RNG's state as plain tensors and lists (loadable with ``weights_only=True``)."""
    version, state, gauss = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [version, list(state), gauss],
        "numpy": [
            np_state[0],
            torch.from_numpy(np_state[1].astype(np.int64)),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    version, values, gauss = state["python"]
    random.setstate((version, tuple(values), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


class RunFolder:
    """A run's folder: ``recipe.yaml`` (resolved), ``run.json`` (the run's identity),
    ``metrics.csv`` (appended), checkpoints, PNGs.

    One run per folder: the writing process (``lock=True``, rank 0) holds an exclusive lock on
    ``.lock`` until :meth:`close` (or its exit), so a second run into the same folder stops at once.
    A new run refuses a folder that already holds one; a resumed run needs one.

    Raises:
        ConfigError: the path is a file or cannot be created or written, the folder is in use,
            already holds a run (new) or holds none (resume).
    """

    def __init__(self, path: str | Path, columns: list[str], *, resume: bool = False, lock: bool = True) -> None:
        self.path = Path(path)
        self.columns = columns
        self._lock: FolderLock | None = None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise ConfigError(f"run folder {str(self.path)!r} is a file; give a folder path (--out)") from None
        except OSError as exc:
            raise ConfigError(f"cannot create run folder {str(self.path)!r}: {exc.strerror or exc}") from None
        if lock:
            self._lock = FolderLock(
                self.path,
                f"run folder {str(self.path)!r} is in use by another run; "
                "wait for it to finish or choose another --out",
            )
            remove_stale_temporaries(self.path)
            self._check_state(resume)

    def _check_state(self, resume: bool) -> None:
        holds_run = (self.path / "last.pt").exists()
        if not resume and not holds_run and (self.path / "recipe.yaml").exists():
            self._clear_unfinished_start()
        if resume and not (self.path / "last.pt").is_file():
            self.close()
            raise ConfigError(f"{self.path} holds no last.pt to resume from; start a new run instead")
        if not resume and holds_run:
            self.close()
            raise ConfigError(
                f"{self.path} already holds a run; continue it with --resume {self.path} or choose another --out"
            )

    def _clear_unfinished_start(self) -> None:
        """A run stopped before its first checkpoint (killed, crashed) left a recipe but nothing to
        resume: it is started again, and says so."""
        import warnings

        for name in ("run.json", "recipe.yaml", "metrics.csv", "summary.json"):
            (self.path / name).unlink(missing_ok=True)
        warnings.warn(
            f"{self.path} held a run that stopped before its first checkpoint; starting it again", stacklevel=3
        )

    def close(self) -> None:
        """Release the folder for other runs."""
        if self._lock is not None:
            self._lock.release()

    def __del__(self) -> None:
        self.close()

    def start_identity(self) -> str:
        """A new run's id, written to ``run.json``; checkpoints carry it."""
        run_id = uuid.uuid4().hex
        identity = json.dumps({"run_id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
        atomic_write(self.path / "run.json", lambda tmp: tmp.write_text(identity))
        return run_id

    def identity(self) -> str:
        """The id of the run this folder holds (from ``run.json``).

        Raises:
            ConfigError: no readable ``run.json``.
        """
        try:
            return str(json.loads((self.path / "run.json").read_text())["run_id"])
        except (OSError, ValueError, KeyError, TypeError):
            raise ConfigError(
                f"{self.path} has no readable run.json (the run's identity); it was not written by "
                f"this version of upzoo train, so it cannot be resumed: start a new run"
            ) from None

    def check_checkpoint_identity(self, state: dict[str, Any], name: str = "last.pt") -> None:
        """Refuse a checkpoint that another run wrote (copied into this folder).

        Raises:
            TrainingError: naming both run ids.
        """
        own, theirs = self.identity(), state.get("run_id")
        if theirs != own:
            raise TrainingError(
                f"{self.path / name} belongs to run {theirs}, not to this folder's run {own} "
                f"(run.json); it was copied from another run folder: start a new run from it instead"
            )

    def write_recipe(self, recipe_dict: dict[str, Any]) -> None:
        text = yaml.safe_dump(recipe_dict, sort_keys=False)
        atomic_write(self.path / "recipe.yaml", lambda tmp: tmp.write_text(text))

    def log(self, row: dict[str, Any]) -> None:
        path = self.path / "metrics.csv"
        new = not path.exists()
        with open(path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})

    def truncate_metrics(self, step: int) -> None:
        """Drop metric rows after ``step`` (written after the checkpoint a resume starts from)."""
        path = self.path / "metrics.csv"
        if not path.exists():
            return
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) <= step]
        path.unlink()
        for row in rows:
            self.log(row)

    def read_metrics(self) -> list[dict[str, str]]:
        path = self.path / "metrics.csv"
        if not path.exists():
            return []
        with open(path, newline="") as f:
            return list(csv.DictReader(f))


class StopFlag:
    """Turns the first Ctrl-C (SIGINT) or SIGTERM into a request to stop after the current step;
    a second Ctrl-C interrupts at once. Checkpoints are atomic, so the last one stays intact."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def request(self) -> None:
        self.requested = True

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        import sys

        print(
            f"\nupzoo: {signal.Signals(signum).name} received: stopping after this step and saving a checkpoint "
            f"(press Ctrl-C again to abort now)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> StopFlag:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


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
