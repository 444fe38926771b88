"""The DCGAN training loop: non-saturating loss, a fixed latent batch for comparable sample grids,
the checkerboard score of the samples, checkpoints and resume."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.metrics.checkerboard import image_checkerboard
from upzoo.errors import ConfigError
from upzoo.models import build_discriminator, build_model
from upzoo.train.checkpoint import load_checkpoint, load_weights, save_checkpoint
from upzoo.train.common import (RunFolder, StopFlag, Throughput, autocast, build_optimizer, check_finite,
                                check_finite_parameters, pick_device,
                                restore_rng_state, rng_state, seed_everything)
from upzoo.train.distributed import (ResumableSampler, all_reduce_mean, any_rank, finish_distributed, init_distributed,
                                     resumable_batches, sync_buffers)
from upzoo.train.plots import plot_curves, sample_grid
from upzoo.recipe import Recipe
from upzoo.tables import to_json

__all__ = ["train_gan"]

COLUMNS = ["step", "epoch", "loss_d", "loss_g", "d_real", "d_fake", "samples_per_s", "checkerboard"]


def train_gan(
    recipe: Recipe,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[int, float, StopFlag], None] | None = None,
) -> dict[str, Any]:
    """Train the recipe's DCGAN into ``run_dir``; ``samples_XXXXXX.png`` show a fixed latent batch."""
    from upzoo.data.factory import build_datasets

    cfg, data_cfg, spec = recipe.train, recipe.data, recipe.model
    device = pick_device(cfg.device)
    autocast(cfg.amp, device)  # an amp mode this device lacks fails now, before any work
    ctx = init_distributed(device)
    run = RunFolder(run_dir, COLUMNS, resume=resume, lock=ctx.is_main)
    seed_everything(cfg.seed, cfg.deterministic)
    resolution, latent = spec.options["resolution"], spec.options["latent_dim"]
    bundle = build_datasets(data_cfg, task="gan", resolution=resolution)
    generator = build_model(spec).to(device)
    discriminator = build_discriminator(spec, base_channels=cfg.discriminator_base_channels).to(device)
    channels = spec.options["out_channels"]
    if bundle.train[0]["image"].shape[0] != channels:
        raise ConfigError(f"model.out_channels is {channels} but the images have {bundle.train[0]['image'].shape[0]} channels")
    g_net = nn.parallel.DistributedDataParallel(generator) if ctx.enabled else generator
    d_net = nn.parallel.DistributedDataParallel(discriminator) if ctx.enabled else discriminator
    sampler = ResumableSampler(bundle.train, shuffle=True, seed=cfg.seed, rank=ctx.rank, world_size=ctx.world_size)
    steps_per_epoch = len(sampler) // data_cfg.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"data.batch_size {data_cfg.batch_size} exceeds the {len(bundle.train)} training images")
    total_steps = cfg.max_steps or cfg.epochs * steps_per_epoch
    opt_g, opt_d = build_optimizer(generator.parameters(), cfg), build_optimizer(discriminator.parameters(), cfg)
    fixed_z = torch.randn(64, latent, generator=torch.Generator().manual_seed(cfg.seed)).to(device)
    step, epoch, run_id = 0, 0, None
    if resume:
        path = run.path / "last.pt"
        state = load_checkpoint(path, kind="gan", purpose="resuming a GAN run")
        if ctx.is_main:
            run.check_checkpoint_identity(state)
        run_id = state["run_id"]
        load_weights(generator, state["generator"], path, saved_spec=state["model_spec"], expected_spec=spec.to_dict())
        load_weights(discriminator, state["discriminator"], path)
        opt_g.load_state_dict(state["opt_g"])
        opt_d.load_state_dict(state["opt_d"])
        step = state["step"]
        epoch = step // steps_per_epoch
        restore_rng_state(state["rng"])
        if ctx.is_main:
            run.truncate_metrics(step)
    elif ctx.is_main:
        run_id = run.start_identity()
        run.write_recipe(recipe.to_dict())

    def checkpoint() -> None:
        sync_buffers(generator, ctx)
        sync_buffers(discriminator, ctx)
        if ctx.is_main:
            check_finite_parameters([generator, discriminator], step, run.path)
            save_checkpoint({"kind": "gan", "run_id": run_id, "model_spec": spec.to_dict(),
                             "generator": generator.state_dict(), "discriminator": discriminator.state_dict(),
                             "opt_g": opt_g.state_dict(), "opt_d": opt_d.state_dict(), "step": step, "epoch": epoch,
                             "rng": rng_state(), "recipe": recipe.to_dict()}, run.path / "last.pt")

    last_score = float("nan")

    def samples() -> None:
        nonlocal last_score
        if not ctx.is_main:
            return
        generator.eval()
        with torch.no_grad(), autocast(cfg.amp, device):
            images = generator(fixed_z).float().cpu()
        generator.train()
        last_score = image_checkerboard(images)
        sample_grid(images, run.path / f"samples_{step:06d}.png")
        run.log({"step": step, "epoch": epoch, "checkerboard": last_score})
        plot_curves(run.read_metrics(), run.path / "curves.png", ["checkerboard"])

    bar = None
    if progress and ctx.is_main:
        from tqdm import tqdm

        bar = tqdm(total=total_steps, initial=step, desc="gan", unit="step", dynamic_ncols=True)
    speed, started, loss_g_value = Throughput(), time.perf_counter(), float("nan")
    with StopFlag() as stop:
        batches = resumable_batches(bundle.train, sampler, start_step=step, steps_per_epoch=steps_per_epoch,
                                    seed=cfg.seed, batch_size=data_cfg.batch_size, num_workers=data_cfg.num_workers,
                                    drop_last=True)
        try:
            while step < total_steps and not stop.requested:
                epoch, batch, ends_epoch = next(batches)
                real = batch["image"].to(device)
                n = real.shape[0]
                z = torch.randn(n, latent, device=device)
                with autocast(cfg.amp, device):
                    fake = g_net(z)
                    # one discriminator forward for real and fake: DDP expects one forward per backward
                    logits_real, logits_fake = d_net(torch.cat([real, fake.detach()])).split([n, n])
                    loss_d = (F.binary_cross_entropy_with_logits(logits_real.float(), torch.ones_like(logits_real.float()))
                              + F.binary_cross_entropy_with_logits(logits_fake.float(), torch.zeros_like(logits_fake.float())))
                check_finite(float(loss_d.detach()), step + 1, "the discriminator loss", run.path)
                opt_d.zero_grad(set_to_none=True)
                loss_d.backward()
                opt_d.step()
                with autocast(cfg.amp, device):
                    logits_gen = d_net(fake).float()
                    loss_g = F.binary_cross_entropy_with_logits(logits_gen, torch.ones_like(logits_gen))  # non-saturating
                loss_g_value = float(loss_g.detach())
                check_finite(loss_g_value, step + 1, "the generator loss", run.path)
                opt_g.zero_grad(set_to_none=True)
                loss_g.backward()
                opt_g.step()
                step += 1
                rate = speed.tick(n * ctx.world_size)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(d=f"{float(loss_d.detach()):.3f}", g=f"{loss_g_value:.3f}", img_s=f"{rate:.1f}")
                if step % cfg.log_every == 0 or step == total_steps:
                    row = {"step": step, "epoch": epoch, "loss_d": all_reduce_mean(float(loss_d.detach()), ctx),
                           "loss_g": all_reduce_mean(loss_g_value, ctx),
                           "d_real": float(torch.sigmoid(logits_real.detach().float()).mean()),
                           "d_fake": float(torch.sigmoid(logits_fake.detach().float()).mean()), "samples_per_s": rate}
                    if ctx.is_main:
                        run.log(row)
                if on_step is not None:
                    on_step(step, loss_g_value, stop)
                if cfg.sample_every and step % cfg.sample_every == 0:
                    samples()
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    checkpoint()
                if ends_epoch:
                    if not cfg.sample_every:
                        samples()
                    if not cfg.checkpoint_every:
                        checkpoint()
                stop.requested = any_rank(stop.requested, ctx)
        finally:
            batches.close()  # stops the loader's workers
        interrupted = stop.requested and step < total_steps
        if not interrupted and not (run.path / f"samples_{step:06d}.png").exists():
            samples()
        checkpoint()
    if bar is not None:
        bar.close()
    summary = {"steps": step, "total_steps": total_steps, "interrupted": interrupted, "last_loss_g": loss_g_value,
               "checkerboard": last_score, "seconds": time.perf_counter() - started, "run_dir": str(run.path)}
    if ctx.is_main:
        (run.path / "summary.json").write_text(to_json(summary))
    run.close()
    finish_distributed(ctx)
    return summary
