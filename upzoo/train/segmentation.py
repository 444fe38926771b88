"""The segmentation training loop (2D images and 3D volumes)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.errors import ConfigError, TrainingError
from upzoo.models import build_model
from upzoo.train.checkpoint import load_checkpoint, load_weights, save_checkpoint
from upzoo.train.common import (RunFolder, StopFlag, Throughput, autocast, build_optimizer, build_scheduler,
                                check_finite, check_finite_parameters, needs_grad_scaler, pick_device, restore_rng_state, rng_state,
                                seed_everything)
from upzoo.train.distributed import (DistContext, ResumableSampler, all_reduce_mean, any_rank, finish_distributed,
                                     init_distributed, resumable_batches, sync_buffers)
from upzoo.train.evaluate import evaluate_segmentation
from upzoo.train.plots import class_palette, plot_curves, prediction_grid
from upzoo.recipe import Recipe
from upzoo.tables import to_json

__all__ = ["train_segmentation", "segmentation_loss", "build_segmentation_model"]

COLUMNS = ["step", "epoch", "loss", "lr", "samples_per_s", "val_miou", "val_pixel_accuracy", "val_mean_dice"]


def segmentation_loss(
    output: torch.Tensor | list[torch.Tensor], target: torch.Tensor, *, kind: str, ignore_index: int, num_classes: int
) -> torch.Tensor:
    """Cross-entropy with ``ignore_index`` (+ soft Dice over the non-ignored pixels for ``ce+dice``).
    With deep supervision (a list), auxiliary outputs are weighted 1/2, 1/4, ... against targets
    downsampled by nearest neighbour."""
    outputs = output if isinstance(output, (list, tuple)) else [output]
    total, weights = 0.0, 0.0
    for i, logits in enumerate(outputs):
        t = target
        if logits.shape[2:] != target.shape[1:]:
            t = F.interpolate(target[:, None].float(), size=logits.shape[2:], mode="nearest")[:, 0].long()
        loss = F.cross_entropy(logits.float(), t, ignore_index=ignore_index)
        if kind == "ce+dice":
            valid = (t != ignore_index).unsqueeze(1)
            probs = logits.float().softmax(1) * valid
            onehot = F.one_hot(t.clamp(0, num_classes - 1), num_classes).movedim(-1, 1) * valid
            dims = tuple(range(2, probs.ndim))
            dice = (2 * (probs * onehot).sum(dims) + 1) / (probs.sum(dims) + onehot.sum(dims) + 1)
            loss = loss + (1 - dice.mean())
        w = 0.5**i
        total, weights = total + w * loss, weights + w
    return total / weights


def build_segmentation_model(recipe: Recipe, bundle) -> tuple[nn.Module, dict[str, Any]]:
    """The recipe's model, with ``strides: auto`` planned from the data's spacing; checks classes."""
    spec = recipe.model
    if spec.options.get("strides") == "auto":
        patch = recipe.data.crop_size
        if bundle.spacing is None or patch is None:
            raise ConfigError("model.strides 'auto' needs volume data (spacing) and data.crop_size (the patch)")
        spec = spec.resolve_auto_strides(bundle.spacing, patch)
    model = build_model(spec)  # the constructor checks the ranges first
    classes = spec.options.get("num_classes", spec.options.get("classes"))
    if bundle.num_classes is not None and classes != bundle.num_classes:
        raise ConfigError(f"model has {classes} classes but the data has {bundle.num_classes}; "
                          f"set model.num_classes: {bundle.num_classes}")
    from upzoo.recipe import _plain

    return model, _plain(spec.to_dict())


def train_segmentation(
    recipe: Recipe,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[int, float, StopFlag], None] | None = None,
) -> dict[str, Any]:
    """Train ``recipe`` into ``run_dir`` (or continue the run there with ``resume``).

    Returns the summary also written to ``summary.json``. Ctrl-C / SIGTERM stop after the current
    step with ``last.pt`` saved (``summary["interrupted"]``).

    Raises:
        TrainingError: a non-finite loss (the last good checkpoint is kept).
    """
    from upzoo.data.factory import build_datasets

    cfg, data_cfg = recipe.train, recipe.data
    device = pick_device(cfg.device)
    autocast(cfg.amp, device)  # an amp mode this device lacks fails now, before any work
    ctx = init_distributed(device)
    run = RunFolder(run_dir, COLUMNS, resume=resume, lock=ctx.is_main)
    seed_everything(cfg.seed, cfg.deterministic)
    bundle = build_datasets(data_cfg, task="segmentation", num_classes=recipe.model.options.get("num_classes"),
                            in_channels=recipe.model.options.get("in_channels"))
    model, resolved_model = build_segmentation_model(recipe, bundle)
    volumes = data_cfg.kind == "volumes"
    num_classes = bundle.num_classes or resolved_model["num_classes"]
    model.to(device)
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last if not volumes else torch.channels_last_3d)
    net = nn.parallel.DistributedDataParallel(model) if ctx.enabled else model

    sampler = ResumableSampler(bundle.train, shuffle=True, seed=cfg.seed, rank=ctx.rank, world_size=ctx.world_size)
    loader_kwargs = dict(batch_size=data_cfg.batch_size, num_workers=data_cfg.num_workers, drop_last=True,
                         pin_memory=device.type == "cuda")
    steps_per_epoch = len(sampler) // data_cfg.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"data.batch_size {data_cfg.batch_size} is larger than this rank's share of the "
                          f"{len(bundle.train)} training samples; lower it")
    total_steps = cfg.max_steps or cfg.epochs * steps_per_epoch
    optimizer = build_optimizer(model.parameters(), cfg)
    scheduler = build_scheduler(optimizer, cfg, total_steps)
    scaler = torch.amp.GradScaler(device.type) if needs_grad_scaler(cfg.amp, device) else None
    step, epoch, best, run_id = 0, 0, float("-inf"), None
    if resume:
        state = load_checkpoint(run.path / "last.pt", kind="segmentation", purpose="resuming a segmentation run")
        if ctx.is_main:
            run.check_checkpoint_identity(state)
        run_id = state["run_id"]
        load_weights(model, state["model"], run.path / "last.pt", saved_spec=state["model_spec"],
                     expected_spec=resolved_model)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        step, best = state["step"], state["best_metric"]
        epoch = step // steps_per_epoch
        restore_rng_state(state["rng"])
        if ctx.is_main:
            run.truncate_metrics(step)
    elif ctx.is_main:
        run_id = run.start_identity()
        run.write_recipe({**recipe.to_dict(), "model": resolved_model})

    def checkpoint(name: str) -> None:
        sync_buffers(model, ctx)
        if ctx.is_main:
            check_finite_parameters([model], step, run.path)
            save_checkpoint({
                "kind": "segmentation", "run_id": run_id, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else {}, "step": step, "epoch": epoch,
                "best_metric": best, "rng": rng_state(), "recipe": recipe.to_dict(), "model_spec": resolved_model,
            }, run.path / name)

    palette_src = None
    if data_cfg.kind == "cityscapes":
        from upzoo.data.cityscapes import PALETTE as palette_src
    palette = class_palette(num_classes, palette_src)
    from upzoo.data.transforms import IMAGENET_MEAN, IMAGENET_STD

    mean_std = (IMAGENET_MEAN, IMAGENET_STD) if (data_cfg.normalize in (None, "imagenet") and not volumes) else (None, None)
    last_val: dict[str, Any] = {}
    last_val_step = -1

    def validate() -> None:
        nonlocal best, last_val, last_val_step
        if bundle.val is None or last_val_step == step:
            return
        last_val_step = step
        sync_buffers(model, ctx)
        metrics, examples = evaluate_segmentation(
            model, bundle.val, num_classes=num_classes, ignore_index=bundle.ignore_index, device=device,
            amp=cfg.amp, ctx=ctx, volumes=volumes, patch_size=recipe.eval.window_patch(data_cfg.crop_size),
            overlap=recipe.eval.overlap, window_batch=recipe.eval.batch_size, keep=recipe.eval.grid_samples)
        last_val = metrics
        if ctx.is_main:
            run.log({"step": step, "epoch": epoch, "val_miou": metrics["miou"],
                     "val_pixel_accuracy": metrics["pixel_accuracy"], "val_mean_dice": metrics["mean_dice"]})
            prediction_grid(examples, run.path / "predictions.png", palette=palette, mean=mean_std[0], std=mean_std[1])
            plot_curves(run.read_metrics(), run.path / "curves.png", ["val_miou"] + (["val_mean_dice"] if volumes else []))
        if metrics["miou"] > best:
            best = metrics["miou"]
            checkpoint("best.pt")

    bar = None
    if progress and ctx.is_main:
        from tqdm import tqdm

        bar = tqdm(total=total_steps, initial=step, desc="train", unit="step", dynamic_ncols=True)
    speed, started, interrupted = Throughput(), time.perf_counter(), False
    loss_value = float("nan")
    net.train()
    with StopFlag() as stop:
        batches = resumable_batches(bundle.train, sampler, start_step=step, steps_per_epoch=steps_per_epoch,
                                    seed=cfg.seed, **loader_kwargs)
        try:
            while step < total_steps and not stop.requested:
                epoch, batch, ends_epoch = next(batches)
                images, masks = batch["image"].to(device, non_blocking=True), batch["mask"].to(device, non_blocking=True)
                if cfg.channels_last:
                    images = images.contiguous(memory_format=torch.channels_last if not volumes else torch.channels_last_3d)
                with autocast(cfg.amp, device):
                    output = net(images)
                loss = segmentation_loss(output, masks, kind=cfg.loss, ignore_index=bundle.ignore_index,
                                         num_classes=num_classes)
                loss_value = float(loss.detach())
                check_finite(loss_value, step + 1, "the training loss", run.path)
                optimizer.zero_grad(set_to_none=True)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.unscale_(optimizer)
                else:
                    loss.backward()
                if cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                scheduler.step()
                step += 1
                rate = speed.tick(images.shape[0] * ctx.world_size)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss_value:.4f}", img_s=f"{rate:.1f}", epoch=epoch)
                if step % cfg.log_every == 0 or step == total_steps:
                    mean_loss = all_reduce_mean(loss_value, ctx)
                    if ctx.is_main:
                        run.log({"step": step, "epoch": epoch, "loss": mean_loss,
                                 "lr": optimizer.param_groups[0]["lr"], "samples_per_s": rate})
                if on_step is not None:
                    on_step(step, loss_value, stop)
                if cfg.val_every and step % cfg.val_every == 0:
                    validate()
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    checkpoint("last.pt")
                if ends_epoch:
                    if not cfg.val_every:
                        validate()
                    if not cfg.checkpoint_every:
                        checkpoint("last.pt")
                stop.requested = any_rank(stop.requested, ctx)
        finally:
            batches.close()  # stops the loader's workers
        interrupted = stop.requested and step < total_steps
        if not interrupted:
            validate()  # the final model is always evaluated (a no-op if this step already was)
        checkpoint("last.pt")
    if bar is not None:
        bar.close()
    summary = {
        "steps": step, "total_steps": total_steps, "epochs_started": epoch + 1, "interrupted": interrupted,
        "last_loss": loss_value, "val": last_val, "best_miou": best if best > float("-inf") else None,
        "seconds": time.perf_counter() - started, "world_size": ctx.world_size,
        "ranks_in_sync": _ranks_in_sync(model, ctx), "run_dir": str(run.path),
    }
    if ctx.is_main:
        (run.path / "summary.json").write_text(to_json(summary))
    run.close()
    finish_distributed(ctx)
    return summary


def _ranks_in_sync(model: nn.Module, ctx: DistContext) -> bool | None:
    """Whether every rank holds exactly the same parameters (None in a single process)."""
    if not ctx.enabled:
        return None
    import torch.distributed as dist

    checksum = torch.tensor([float(sum(p.detach().double().sum() for p in model.parameters()))], dtype=torch.float64)
    gathered = [torch.zeros_like(checksum) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, checksum)
    in_sync = all(torch.equal(g, gathered[0]) for g in gathered)
    if not in_sync:
        raise TrainingError(f"DDP ranks hold different parameters at the end of training: {[float(g) for g in gathered]}")
    return True
