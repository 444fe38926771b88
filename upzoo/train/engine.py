"""The one training loop. A :class:`~upzoo.train.tasks.Task` says what a step and an evaluation
are; the :class:`Trainer` owns the rest for every task: device, DistributedDataParallel, mixed
precision (bf16, or fp16 with a gradient scaler), gradient clipping, channels_last, schedules,
periodic evaluation, atomic checkpoints with exact resume, Ctrl-C at a step boundary, NaN stops,
progress and loggers."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from upzoo.collectives import all_gather_objects
from upzoo.errors import ConfigError
from upzoo.figures import plot_curves
from upzoo.machine import machine_record
from upzoo.runs.checkpoint import save_checkpoint
from upzoo.runs.folder import RunFolder
from upzoo.runtime import (
    StopFlag,
    atomic_write,
    autocast,
    needs_grad_scaler,
    resolve_device,
    rng_state,
    seed_everything,
)
from upzoo.tables import to_json
from upzoo.train.context import EngineContext
from upzoo.train.determinism import check_deterministic, restore_deterministic, use_deterministic
from upzoo.train.distributed import (
    ResumableSampler,
    all_reduce_mean,
    any_rank,
    finish_distributed,
    init_distributed,
    ranks_in_sync,
    resumable_batches,
    sync_buffers,
    wrap_ddp,
)
from upzoo.train.loggers import extra_loggers
from upzoo.train.monitor import StartEstimate, Throughput, check_finite, check_finite_parameters, say
from upzoo.train.optim import build_optimizer, build_scheduler
from upzoo.train.resume import restore_run
from upzoo.train.tasks import Task

__all__ = ["Trainer", "train"]


class Trainer(EngineContext):
    """Train ``task`` (built from a prepared recipe) into ``run_dir``, or continue it (``resume``).

    ``on_step(step, loss, stop)`` is called after every step (tests and benchmarks use it; calling
    ``stop.request()`` stops like Ctrl-C).
    """

    def __init__(
        self,
        task: Task,
        run_dir: str | Path,
        *,
        resume: bool = False,
        progress: bool = True,
        on_step: Callable[[int, float, StopFlag], None] | None = None,
    ) -> None:
        self.task, self.recipe = task, task.prepared.recipe
        self.cfg, self.resume, self.progress, self.on_step = self.recipe.train, resume, progress, on_step
        self.device = resolve_device(self.cfg.device, "train.device")
        autocast(self.cfg.amp, self.device)  # an amp mode this device lacks fails now, before any work
        self.run_dir, self.ctx, self.run = Path(run_dir), None, None
        self.loggers: list[Any] = []
        self._acquired = self._released = False

    def acquire(self) -> None:
        """Join the process group, lock the run folder, seed, place the modules and build the
        optimisers — once; :meth:`fit` calls it, and a failure here releases what was taken.

        Raises:
            ConfigError: a folder in use or a data set smaller than a batch (named).
        """
        if self._acquired:
            return
        self._acquired = True
        try:
            self.ctx = init_distributed(self.device)
            self.device = self.ctx.device  # cuda:LOCAL_RANK for a DDP rank on CUDA
            self._set_up(self.run_dir)
        except BaseException:
            self.release(failed=True)
            raise

    def _set_up(self, run_dir: str | Path) -> None:
        """The run folder (locked), the seed, the modules on the device, the optimisers."""
        task = self.task
        columns = ["step", "epoch", *task.step_columns, "lr", "samples_per_s", *task.eval_columns]
        self.run = RunFolder(run_dir, columns, resume=self.resume, lock=self.ctx.is_main)
        seed_everything(self.cfg.seed)
        if self.cfg.deterministic:  # a model with an op CUDA cannot run deterministically is refused now
            check_deterministic(task.modules, task.input_shapes(), self.device)
        self.step, self.epoch, self.best, self.run_id = 0, 0, float("-inf"), None
        self.last_eval: dict[str, Any] = {}
        self._last_eval_step = -1
        self._place_modules()
        self._build_optimizers()

    # -- set-up ------------------------------------------------------------------------------------
    def _place_modules(self) -> None:
        self.channels_last = None
        if self.cfg.channels_last:
            self.channels_last = torch.channels_last_3d if self.recipe.data.kind == "volumes" else torch.channels_last
        self._wrapped: dict[str, nn.Module] = {}
        for name, module in self.task.modules.items():
            module.to(self.device)
            if self.channels_last is not None:
                module.to(memory_format=self.channels_last)
            self._wrapped[name] = wrap_ddp(module, self.ctx)

    def _build_optimizers(self) -> None:
        data = self.task.prepared.data
        self.sampler = ResumableSampler(
            data.train, shuffle=True, seed=self.cfg.seed, rank=self.ctx.rank, world_size=self.ctx.world_size
        )
        self.steps_per_epoch = len(self.sampler) // self.recipe.data.batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"data.batch_size {self.recipe.data.batch_size} is larger than this rank's share of "
                f"the {len(data.train)} training samples; lower it"
            )
        self.total_steps = self.cfg.max_steps or self.cfg.epochs * self.steps_per_epoch
        self.optimizers = {n: build_optimizer(m.parameters(), self.cfg) for n, m in self.task.modules.items()}
        self.schedulers = {n: build_scheduler(o, self.cfg, self.total_steps) for n, o in self.optimizers.items()}
        self.scaler = torch.amp.GradScaler(self.device.type) if needs_grad_scaler(self.cfg.amp, self.device) else None

    def optimize(self, loss: torch.Tensor, name: str) -> float:
        """One update of module ``name`` from ``loss``: a NaN check, backward (scaled for fp16),
        gradient clipping (after unscaling) and the optimiser step. Returns the loss value."""
        value = float(loss.detach())
        check_finite(
            value, self.step + 1, f"the {name} loss" if len(self.optimizers) > 1 else "the training loss", self.run.path
        )
        optimizer = self.optimizers[name]
        optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(optimizer)
        else:
            loss.backward()
        if self.cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.task.modules[name].parameters(), self.cfg.grad_clip)
        if self.scaler is not None:
            self.scaler.step(optimizer)
        else:
            optimizer.step()
        return value

    # -- checkpoints -------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "kind": self.task.kind,
            "run_id": self.run_id,
            "step": self.step,
            "epoch": self.epoch,
            "best_metric": self.best,
            "rng": rng_state(),
            "recipe": self.recipe.to_dict(),
            "model_spec": self.task.prepared.model_dict(),
            "data_meta": self.task.prepared.data_meta(),
            "optimizers": {n: o.state_dict() for n, o in self.optimizers.items()},
            "schedulers": {n: s.state_dict() for n, s in self.schedulers.items()},
            "scaler": self.scaler.state_dict() if self.scaler is not None else {},
        }
        state.update({name: module.state_dict() for name, module in self.task.modules.items()})
        return state

    def save(self, name: str) -> None:
        """Write ``RUN/name`` atomically (rank 0), with every rank's BatchNorm statistics in sync."""
        for module in self.task.modules.values():
            sync_buffers(module, self.ctx)
        if self.ctx.is_main:
            check_finite_parameters(self.task.modules.values(), self.step, self.run.path)
            save_checkpoint(self._state(), self.run.path / name)

    def _start(self) -> None:
        if self.resume:
            restore_run(self)
        elif self.ctx.is_main:
            resolved = {**self.recipe.to_dict(), "model": self.task.prepared.model_dict()}
            self.run_id = self.run.start_identity(resolved)
            self.run.write_recipe(resolved)
        resume_step = self.step if self.resume else None
        self.loggers = (
            extra_loggers(self.cfg.loggers, self.run.path, resume_step=resume_step) if self.ctx.is_main else []
        )

    # -- logging and evaluation --------------------------------------------------------------------
    def _log(self, row: dict[str, Any]) -> None:
        if self.ctx.is_main:
            self.run.log(row)
            for logger in self.loggers:
                logger.log(row)

    def _log_step(self, values: dict[str, float], rate: float) -> None:
        row = {key: all_reduce_mean(value, self.ctx) for key, value in values.items()}
        lr = next(iter(self.optimizers.values())).param_groups[0]["lr"]
        self._log({"step": self.step, "epoch": self.epoch, **row, "lr": lr, "samples_per_s": rate})

    def evaluate(self) -> None:
        """The task's evaluation (once per step at most), logged; a new best is saved as ``best.pt``."""
        if self._last_eval_step == self.step:
            return
        self._last_eval_step = self.step
        for module in self.task.modules.values():
            sync_buffers(module, self.ctx)
        # every rank takes rank 0's row, so every rank takes the same branch below: a task that
        # evaluates on rank 0 alone must not leave the others out of the collectives of save()
        row = all_gather_objects(self.task.evaluate(self))[0]
        if not row:
            return
        self.last_eval = row
        self._log({"step": self.step, "epoch": self.epoch, **row})
        if self.ctx.is_main:
            plot_curves(self.run.read_metrics(), self.run.path / "curves.png", self.task.curve_columns,
                        self.task.curve_baselines)  # fmt: skip
        key = self.task.best_key
        if key is not None and row[key] > self.best:
            self.best = row[key]
            self.save("best.pt")

    # -- the loop ----------------------------------------------------------------------------------
    def _after_step(self, values: dict[str, float], rate: float, ends_epoch: bool, stop: StopFlag) -> None:
        cfg, every = self.cfg, self.task.eval_every(self.cfg)
        if self.step % cfg.log_every == 0 or self.step == self.total_steps:
            self._log_step(values, rate)
        if self.on_step is not None:
            self.on_step(self.step, next(iter(values.values())), stop)
        if every and self.step % every == 0:
            self.evaluate()
        if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
            self.save("last.pt")
        if ends_epoch:
            if not every:
                self.evaluate()
            if not cfg.checkpoint_every:
                self.save("last.pt")

    def _train_steps(self, stop: StopFlag, bar) -> dict[str, float]:
        data = self.recipe.data
        batches = resumable_batches(
            self.task.prepared.data.train,
            self.sampler,
            start_step=self.step,
            steps_per_epoch=self.steps_per_epoch,
            seed=self.cfg.seed,
            batch_size=data.batch_size,
            num_workers=data.num_workers,
            drop_last=True,
            pin_memory=self.device.type == "cuda",
        )
        speed, values, estimate = Throughput(), {}, StartEstimate(self.step, self.total_steps)
        for module in self.task.modules.values():
            module.train()
        try:
            while self.step < self.total_steps and not stop.requested:
                self.epoch, batch, ends_epoch = next(batches)
                values = self.task.step(batch, self)
                if self.scaler is not None:
                    self.scaler.update()
                for scheduler in self.schedulers.values():
                    scheduler.step()
                self.step += 1
                rate = speed.tick(len(batch["image"]) * self.ctx.world_size)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix({k: f"{v:.4f}" for k, v in values.items()} | {"img_s": f"{rate:.1f}"})
                if self.ctx.is_main and (said := estimate.tick(self.step)):
                    say(said, bar)
                self._after_step(values, rate, ends_epoch, stop)
                stop.requested = any_rank(stop.requested, self.ctx)
        finally:
            batches.close()  # stops the loader's workers
        return values

    def fit(self) -> dict[str, Any]:
        """Train to ``total_steps`` (or until Ctrl-C); returns the summary also written to ``summary.json``.
        Takes the run (:meth:`acquire`) and gives it back (:meth:`release`) on every exit.

        Raises:
            TrainingError: a non-finite loss or parameter (the last good checkpoint is kept).
            ConfigError: as :meth:`acquire`, or a checkpoint of another run to resume.
        """
        self.acquire()
        try:
            self._start()
        except BaseException:  # a checkpoint that does not load, a folder that cannot be written
            self.release(failed=True)
            raise
        bar = None
        if self.progress and self.ctx.is_main:
            from tqdm import tqdm

            bar = tqdm(total=self.total_steps, initial=self.step, desc=self.task.kind, unit="step", dynamic_ncols=True)
        started = time.perf_counter()
        kernels_before = use_deterministic(self.cfg.deterministic)
        try:
            with StopFlag() as stop:
                last = self._train_steps(stop, bar)
                interrupted = stop.requested and self.step < self.total_steps
                if not interrupted:
                    self.evaluate()  # the final model is always evaluated (a no-op if this step already was)
                self.save("last.pt")
        except BaseException:
            self.release(failed=True)
            raise
        finally:
            restore_deterministic(kernels_before)
            if bar is not None:
                bar.close()  # before any error line: the bar must not share its line
        try:  # the summary's checks (ranks in sync) can fail too: teardown on every exit
            summary = self._finish(last, interrupted, time.perf_counter() - started, stop.requested)
        except BaseException:
            self.release(failed=True)
            raise
        self.release()
        return summary

    def _finish(self, last: dict[str, float], interrupted: bool, seconds: float, stop: bool) -> dict[str, Any]:
        """The run's summary (``summary.json``); ``stop_requested``: a Ctrl-C or SIGTERM came, also one
        during the last evaluation of a run that then finished (what runs it, e.g. a comparison, stops)."""
        best = self.best if self.best > float("-inf") else None
        summary = {
            "steps": self.step,
            "total_steps": self.total_steps,
            "epochs_started": self.epoch + 1,
            "interrupted": interrupted,
            "stop_requested": stop,
            **self.task.summary(last, best),
            "seconds": seconds,
            "world_size": self.ctx.world_size,
            "deterministic": self.cfg.deterministic,
            "machine": machine_record(self.device),
            "ranks_in_sync": ranks_in_sync(self.task.modules, self.ctx),
            "run_dir": str(self.run.path),
        }
        if self.ctx.is_main:
            atomic_write(self.run.path / "summary.json", lambda tmp: tmp.write_text(to_json(summary)))
        return summary

    def release(self, *, failed: bool = False) -> None:
        """Close the loggers (TensorBoard flushed), release the run folder's lock and tear down the
        process group this run created — once, after success and after a failure alike (a failed
        rank does not wait for the others at a barrier)."""
        if self._released:
            return
        self._released = True
        try:
            for logger in self.loggers:  # only the main rank has loggers
                logger.close()
        finally:
            if self.run is not None:
                self.run.close()
            if self.ctx is not None:
                finish_distributed(self.ctx, wait=not failed)


def train(
    recipe: Any,
    run_dir: str | Path,
    *,
    resume: bool | Literal["auto"] = False,
    progress: bool = True,
    on_step: Callable[[int, float, StopFlag], None] | None = None,
) -> dict[str, Any]:
    """Train a recipe (segmentation or GAN) into ``run_dir``: ``prepare`` -> task -> :class:`Trainer`.

    Returns the summary also written to ``summary.json``; Ctrl-C / SIGTERM stop after the current
    step with ``last.pt`` saved (``summary["interrupted"]``). ``resume="auto"``: continue ``run_dir``
    if it holds an unfinished run of this recipe, return its summary if it holds a finished one,
    start a new run if it holds none (and refuse a run of another recipe) — safe to run again and
    again, as requeued cluster jobs are.
    """
    from upzoo.prepare import prepare
    from upzoo.runs.state import run_state
    from upzoo.train.task_factory import make_task

    prepared = prepare(recipe)
    if resume == "auto":
        state, summary = run_state(run_dir, prepared)
        if state == "done":
            return {**summary, "reused": True}
        resume = state == "resume"
    return Trainer(make_task(prepared), run_dir, resume=resume, progress=progress, on_step=on_step).fit()
