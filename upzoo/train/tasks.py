"""What a training task says: its modules, one optimisation step, one evaluation and its summary.
The :class:`~upzoo.train.engine.Trainer` owns everything else (device, DDP, AMP, clipping,
schedules, checkpoints, resume, Ctrl-C, logging), so a feature added there reaches every task."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from upzoo.figures import class_palette, prediction_grid, sample_grid
from upzoo.models import build_discriminator, build_model
from upzoo.train.context import StepContext
from upzoo.train.evaluate import evaluate_segmentation
from upzoo.windows import window_patch

if TYPE_CHECKING:
    from upzoo.prepare import Prepared

__all__ = ["Task", "SegmentationTask", "GanTask", "segmentation_loss"]


class Task:
    """The interface. ``modules`` are trained (one optimiser each), checkpointed and DDP-wrapped;
    ``step_columns``/``eval_columns`` name what :meth:`step` and :meth:`evaluate` return, and
    ``curve_columns`` what ``curves.png`` shows, and ``curve_baselines`` (set by an evaluation) the
    reference line drawn in a curve's panel: ``{column: (label, value)}``, e.g. bicubic's PSNR."""

    kind: str
    step_columns: list[str]
    eval_columns: list[str]
    curve_columns: list[str]
    best_key: str | None = None  # an evaluation value whose best is kept as best.pt

    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared
        self.modules: dict[str, nn.Module] = {}
        self.curve_baselines: dict[str, tuple[str, float] | list[tuple[str, float]]] = {}

    def eval_every(self, cfg: Any) -> int | None:
        return cfg.val_every

    def step(self, batch: dict, ctx: StepContext) -> dict[str, float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def evaluate(self, ctx: StepContext) -> dict[str, float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def summary(self, last: dict[str, float], best: float | None) -> dict[str, Any]:
        """The task's part of ``summary.json`` from the last step's values and the best evaluation."""
        return {}

    def input_shapes(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        """The shapes of the inputs each module takes in a training step (a batch of 2)."""
        return {"model": ((2, *self.prepared.data.train[0]["image"].shape),)}


def cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, *, weight: torch.Tensor | None = None, ignore_index: int = 255
) -> torch.Tensor:
    """``F.cross_entropy``'s value — the mean over non-ignored pixels, weighted by each target's class
    weight — written with ``log_softmax`` and ``gather``, whose CUDA forward and backward are
    deterministic (``nll_loss2d``'s CUDA kernel has no deterministic implementation, so
    ``train.deterministic`` could not train a segmentation model on a GPU). NaN when every pixel is
    ignored, as PyTorch's.

    >>> logits, target = torch.randn(2, 3, 4, 4, dtype=torch.float64), torch.randint(0, 3, (2, 4, 4))
    >>> torch.allclose(cross_entropy(logits, target), F.cross_entropy(logits, target))
    True
    """
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    nll = -logits.log_softmax(1).gather(1, safe.unsqueeze(1)).squeeze(1)
    weights = valid.to(nll.dtype) if weight is None else weight.to(nll.dtype)[safe] * valid
    return (nll * weights).sum() / weights.sum()


def segmentation_loss(
    output: torch.Tensor | list[torch.Tensor],
    target: torch.Tensor,
    *,
    kind: str,
    ignore_index: int,
    num_classes: int,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy with ``ignore_index`` and optional class ``weight`` (+ soft Dice over the
    non-ignored pixels for ``ce+dice``).
    With deep supervision (a list), auxiliary outputs are weighted 1/2, 1/4, ... against targets
    downsampled by nearest neighbour."""
    outputs = output if isinstance(output, (list, tuple)) else [output]
    total, weights = 0.0, 0.0
    for i, logits in enumerate(outputs):
        t = target
        if logits.shape[2:] != target.shape[1:]:
            t = F.interpolate(target[:, None].float(), size=logits.shape[2:], mode="nearest")[:, 0].long()
        loss = cross_entropy(logits.float(), t, weight=weight, ignore_index=ignore_index)
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


def balanced_class_weights(dataset, num_classes: int, ignore_index: int) -> torch.Tensor:
    """ENet's class weights ``1 / ln(1.02 + p_c)`` from the pixel share ``p_c`` of each class in one
    pass over ``dataset``'s masks (bounded: ~1.4 for a class that covers everything, ~50 for one
    that never appears)."""
    counts = torch.zeros(num_classes, dtype=torch.float64)
    for index in range(len(dataset)):
        mask = torch.as_tensor(dataset[index]["mask"]).flatten()
        mask = mask[mask != ignore_index]
        counts += torch.bincount(mask.clamp(0, num_classes - 1), minlength=num_classes)[:num_classes].double()
    share = counts / counts.sum().clamp_min(1)
    return (1.0 / torch.log(1.02 + share)).float()


class SegmentationTask(Task):
    """2D images and 3D volumes: cross-entropy (+ Dice), validated by mIoU; best.pt by val mIoU."""

    kind = "segmentation"
    step_columns = ["loss"]
    best_key = "val_miou"
    BOUNDARY_2D, BOUNDARY_3D = ("boundary_iou", "boundary_fscore"), ("hd95", "surface_dice")

    def __init__(self, prepared: Prepared) -> None:
        super().__init__(prepared)
        self.modules = {"model": build_model(prepared.spec)}
        self.volumes = prepared.recipe.data.kind == "volumes"
        self.boundary_keys = self.BOUNDARY_3D if self.volumes else self.BOUNDARY_2D
        self.eval_columns = ["val_miou", "val_pixel_accuracy", "val_mean_dice"]
        self.eval_columns += [f"val_{key}" for key in self.boundary_keys]
        self.curve_columns = ["val_miou"] + (["val_mean_dice"] if self.volumes else [])
        self.palette = class_palette(prepared.num_classes, prepared.palette)
        self.last_metrics: dict[str, Any] = {}
        self.class_weight = None
        if prepared.recipe.train.class_weights == "balanced":
            self.class_weight = balanced_class_weights(
                prepared.data.train, prepared.num_classes, prepared.data.ignore_index
            )

    def step(self, batch: dict, ctx: StepContext) -> dict[str, float]:
        images, masks = ctx.to_device(batch["image"], image=True), ctx.to_device(batch["mask"])
        deep = {"aux": True} if self.prepared.spec.options.get("deep_supervision") else {}  # UNet's heads
        with ctx.autocast():
            output = ctx.net("model")(images, **deep)
        data = self.prepared.data
        weight = self.class_weight.to(ctx.device) if self.class_weight is not None else None
        loss = segmentation_loss(
            output,
            masks,
            kind=self.prepared.recipe.train.loss,
            ignore_index=data.ignore_index,
            num_classes=self.prepared.num_classes,
            weight=weight,
        )
        return {"loss": ctx.optimize(loss, "model")}

    def evaluate(self, ctx: StepContext) -> dict[str, float]:
        recipe, data = self.prepared.recipe, self.prepared.data
        metrics, examples = evaluate_segmentation(
            self.modules["model"],
            data.val,
            num_classes=self.prepared.num_classes,
            ignore_index=data.ignore_index,
            device=ctx.device,
            amp=ctx.amp,
            ctx=ctx.dist,
            volumes=self.volumes,
            patch_size=window_patch(recipe, volumes=recipe.data.kind == "volumes"),
            overlap=recipe.eval.overlap,
            window_batch=recipe.eval.batch_size,
            keep=recipe.eval.grid_samples,
        )
        self.last_metrics = metrics
        if ctx.is_main:
            run = ctx.run_path
            prediction_grid(
                examples,
                run / "predictions.png",
                palette=self.palette,
                mean=self.prepared.mean,
                std=self.prepared.std,
                class_names=self.prepared.data.class_names,
            )
        return {
            "val_miou": metrics["miou"],
            "val_pixel_accuracy": metrics["pixel_accuracy"],
            "val_mean_dice": metrics["mean_dice"],
            **{f"val_{key}": metrics.get(key, float("nan")) for key in self.boundary_keys},
        }

    def summary(self, last: dict[str, float], best: float | None) -> dict[str, Any]:
        names = self.prepared.data.class_names or [str(k) for k in range(self.prepared.num_classes)]
        val = {key: by_class_name(value, names) if key.startswith("per_class_") else value
               for key, value in self.last_metrics.items()}  # fmt: skip
        return {"last_loss": last.get("loss", float("nan")), "val": val, "best_miou": best}


def by_class_name(values: Any, names: list[str]) -> Any:
    """A per-class list as ``{class name: value}`` (what ``summary.json`` holds)."""
    if not isinstance(values, (list, tuple)) or len(values) != len(names):
        return values
    return dict(zip(names, values))


class GanTask(Task):
    """DCGAN: non-saturating loss, one discriminator forward for real and fake (DDP needs one forward
    per backward), and the generator's step through the same real + fake batch (a fake-only batch
    would meet other BatchNorm statistics than the discriminator learned on, and fool it for free);
    evaluated on ``eval.gan_images`` images from fixed latents against held-out real
    images (:mod:`upzoo.train.gan_evaluation`: SWD, spectral error and decay, KID/FD with
    ``eval.features``, checkerboard), with a sample grid and ``spectrum.png``."""

    kind = "gan"
    step_columns = ["loss_d", "loss_g", "d_real", "d_fake"]
    eval_columns = ["swd", "spectral_error", "spectral_error_corners", "spectral_decay", "kid", "fd", "checkerboard"]
    curve_columns = ["swd", "spectral_error", "checkerboard"]

    def __init__(self, prepared: Prepared) -> None:
        super().__init__(prepared)
        cfg, spec = prepared.recipe.train, prepared.spec
        self.modules = {
            "generator": build_model(spec),
            "discriminator": build_discriminator(
                spec, base_channels=cfg.discriminator_base_channels, norm=cfg.discriminator_norm
            ),
        }
        self.latent = spec.options["latent_dim"]
        from upzoo.train.gan_evaluation import held_out_images, say_gan_images

        say_gan_images(prepared.recipe.eval.gan_images, *held_out_images(prepared.data))  # before training
        self.fixed_z = torch.randn(64, self.latent, generator=torch.Generator().manual_seed(cfg.seed))
        self.evaluator = None  # the held-out real images are read at the first evaluation
        self.last: dict[str, Any] = {}

    def eval_every(self, cfg: Any) -> int | None:
        return cfg.sample_every

    def input_shapes(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        image = tuple(self.prepared.data.train[0]["image"].shape)
        return {"generator": ((2, self.latent),), "discriminator": ((2, *image),)}

    def step(self, batch: dict, ctx: StepContext) -> dict[str, float]:
        real = ctx.to_device(batch["image"], image=True)
        n = real.shape[0]
        z = torch.randn(n, self.latent, device=ctx.device)
        generator, discriminator = ctx.net("generator"), ctx.net("discriminator")
        with ctx.autocast():
            fake = generator(z)
            logits_real, logits_fake = discriminator(torch.cat([real, fake.detach()])).float().split([n, n])
        loss_d = F.binary_cross_entropy_with_logits(
            logits_real, torch.ones_like(logits_real)
        ) + F.binary_cross_entropy_with_logits(logits_fake, torch.zeros_like(logits_fake))
        loss_d_value = ctx.optimize(loss_d, "discriminator")
        with ctx.autocast():  # the same real + fake batch as the discriminator's step: its BatchNorm sees
            logits_gen = discriminator(torch.cat([real, fake])).float()[n:]  # what it was trained on
        loss_g = F.binary_cross_entropy_with_logits(logits_gen, torch.ones_like(logits_gen))  # non-saturating
        return {
            "loss_d": loss_d_value,
            "loss_g": ctx.optimize(loss_g, "generator"),
            "d_real": float(torch.sigmoid(logits_real.detach()).mean()),
            "d_fake": float(torch.sigmoid(logits_fake.detach()).mean()),
        }

    def evaluate(self, ctx: StepContext) -> dict[str, float]:
        if not ctx.is_main:
            return {}
        from upzoo.train.gan_evaluation import GanEvaluator, held_out_images

        generator = self.modules["generator"]
        generator.eval()
        with torch.no_grad(), ctx.autocast():
            images = generator(self.fixed_z.to(ctx.device)).float().cpu()
        generator.train()
        sample_grid(images, ctx.run_path / f"samples_{ctx.step:06d}.png")
        data, recipe = self.prepared.data, self.prepared.recipe
        real, held_out = held_out_images(data)
        if self.evaluator is None:
            self.evaluator = GanEvaluator(
                real, recipe.eval.gan_images, self.latent, recipe.train.seed, recipe.eval.features
            )
        report = self.evaluator.evaluate(generator, ctx.device, ctx.autocast, ctx.run_path)
        spectra = {
            "spectrum_real": report.spectrum_real.tolist(),
            "spectrum_generated": report.spectrum_generated.tolist(),
        }
        self.last = report.as_dict() | {"real_images": held_out, "images": self.evaluator.count, "val": report.values}
        self.last |= spectra
        return report.values

    def summary(self, last: dict[str, float], best: float | None) -> dict[str, Any]:
        return {"last_loss_g": last.get("loss_g", float("nan")), **self.last}
