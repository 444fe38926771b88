"""Schwarz et al.'s generator testbed (NeurIPS 2021, "On the Frequency Bias of Generative Models"):
a generator regresses a few images from fixed latents with an MSE loss — no discriminator — so
what its spectrum gets wrong is the architecture's doing, not the adversary's. At every evaluation
the PSNR, the power spectrum and the spectral error per ring are written to the run
(``spectra.csv``, ``spectrum_evolution.png``, ``spectral_error_evolution.png``).

Spectra as the testbed defines them (:mod:`upzoo.metrics.spectrum`, the one definition): each
channel's azimuthally averaged power spectrum (rings of floored radius, the Nyquist row and column
counted at both ends), averaged over channels and images, of the generator's raw output and of the
real images in [-1, 1] (no clamping). PSNR on 8-bit images, per image, averaged."""

from __future__ import annotations

import contextlib
import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from upzoo.metrics.image_quality import psnr
from upzoo.metrics.spectrum import RadialSpectrum, corner_error, ring_frequencies, spectral_error
from upzoo.models import build_model
from upzoo.runtime import atomic_write
from upzoo.train.context import StepContext
from upzoo.train.tasks import Task

if TYPE_CHECKING:
    from upzoo.prepare import Prepared

__all__ = ["GeneratorTestbedTask", "channel_spectrum", "measure_generator", "read_spectra", "SPECTRA_FILE"]

SPECTRA_FILE = "spectra.csv"
_COLUMNS = ["step", "ring", "cycles_per_pixel", "real", "generated", "error"]


def channel_spectrum(images: torch.Tensor) -> np.ndarray:
    """:func:`~upzoo.metrics.spectrum.radial_power_spectrum` (the authors' definition: each channel's
    spectrum, averaged over channels and images), ``(R,)``, of ``(N, C, H, W)`` square images of any
    finite values (the generator's raw output, before any clamping)."""
    spectrum = RadialSpectrum(unit_range=False, sync_on_compute=False)
    for batch in images.split(100):
        spectrum.update(batch)
    return spectrum.compute()


@torch.no_grad()
def _generate(model: nn.Module, latents: torch.Tensor, device: torch.device, autocast: Any) -> torch.Tensor:
    was_training = model.training
    model.eval()
    with autocast():
        images = torch.cat([model(z.to(device)).float().cpu() for z in latents.split(100)])
    model.train(was_training)
    return images


def _measure(images: torch.Tensor, targets: torch.Tensor, real: np.ndarray) -> dict[str, Any]:
    """PSNR (8-bit images), the spectrum and its error against the real spectrum ``real``."""
    generated = channel_spectrum(images)
    errors, band = spectral_error(generated, real)
    eight_bit = torch.round(((images + 1) / 2).clamp(0, 1) * 255) / 255
    values = psnr(eight_bit, torch.round((targets + 1) / 2 * 255) / 255)
    return {
        "val_psnr": float(values.mean()),  # inf only when every image is reproduced to the bit
        "val_spectral_error": band,
        "val_spectral_error_corners": corner_error(generated, real),
        "spectrum": generated,
        "error": errors,
    }


def measure_generator(model: nn.Module, data: Any, device: torch.device, autocast: Any) -> dict[str, Any]:
    """``model`` on the testbed's images ``data`` (:class:`~upzoo.data.testbed.RegressionImages`):
    PSNR, spectral errors (``val_*``), the spectrum and the error per ring."""
    return _measure(_generate(model, data.latents, device, autocast), data.images, channel_spectrum(data.images))


def _rows(step: int, real: np.ndarray, measured: dict[str, Any]) -> list[list[Any]]:
    frequencies = ring_frequencies(real)
    return [
        [step, r, frequencies[r], f"{real[r]:.8g}", f"{measured['spectrum'][r]:.8g}", f"{measured['error'][r]:.8g}"]
        for r in range(len(real))
    ]


def read_spectra(path: Path) -> dict[int, dict[str, np.ndarray]]:
    """``spectra.csv`` as ``{step: {"real", "generated", "error": (R,)}}``."""
    table: dict[int, dict[str, list[float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            entry = table.setdefault(int(row["step"]), {"real": [], "generated": [], "error": []})
            for key in entry:
                entry[key].append(float(row[key]))
    return {step: {k: np.asarray(v) for k, v in entry.items()} for step, entry in table.items()}


class GeneratorTestbedTask(Task):
    """A ``pggan`` generator regressing its images (MSE, one latent each); evaluated on those
    images (PSNR, spectral error in the band 0.25-0.5 cycles per pixel and in the corners beyond
    Nyquist) with the spectra over training; ``best.pt`` by PSNR. The untrained generator is
    measured too (step 0), as the testbed does."""

    kind = "generator_testbed"
    step_columns = ["loss"]
    eval_columns = ["val_psnr", "val_spectral_error", "val_spectral_error_corners"]
    curve_columns = ["loss", "val_psnr", "val_spectral_error", "val_spectral_error_corners"]
    best_key = "val_psnr"

    def __init__(self, prepared: Prepared) -> None:
        super().__init__(prepared)
        self.modules = {"model": build_model(prepared.spec)}
        self.data = prepared.data.train
        self.images, self.real = self.data.images, channel_spectrum(self.data.images)
        untrained = _generate(self.modules["model"], self.data.latents, torch.device("cpu"), contextlib.nullcontext)
        self.initial = _measure(untrained, self.images, self.real)
        self.curve_baselines = {k: ("untrained", self.initial[k]) for k in ("val_psnr", "val_spectral_error",
                                                                            "val_spectral_error_corners")}  # fmt: skip
        self.last: dict[str, Any] = {}

    def input_shapes(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        return {"model": ((2, self.data.latents.shape[1]),)}

    def step(self, batch: dict, ctx: StepContext) -> dict[str, float]:
        target = ctx.to_device(batch["image"], image=True)
        with ctx.autocast():
            output = ctx.net("model")(ctx.to_device(batch["latent"]))
        return {"loss": ctx.optimize(F.mse_loss(output.float(), target), "model")}

    def evaluate(self, ctx: StepContext) -> dict[str, float]:
        if not ctx.is_main:
            return {}
        images = _generate(self.modules["model"], self.data.latents, ctx.device, ctx.autocast)
        measured = _measure(images, self.images, self.real)
        self._write(ctx.run_path, ctx.step, measured, images)
        values = {k: measured[k] for k in self.eval_columns}
        val = {k.removeprefix("val_"): v for k, v in values.items()} | {"images": len(self.images)}
        spectra = {"spectrum_real": self.real.tolist(), "spectrum_generated": measured["spectrum"].tolist()}
        self.last = {"val": val, **spectra}
        return values

    def _write(self, folder: Path, step: int, measured: dict[str, Any], images: torch.Tensor) -> None:
        """``spectra.csv`` (rows of later steps, left by an earlier run resumed from here, dropped;
        step 0 from the untrained generator), the two evolution plots and the images."""
        from upzoo.figures import spectral_error_evolution_plot, spectrum_evolution_plot, titled_grid

        path = folder / SPECTRA_FILE
        rows = []
        if path.is_file():
            with open(path, newline="") as f:
                rows = [r for r in csv.reader(f)][1:]
        rows = [r for r in rows if int(r[0]) < step] or _rows(0, self.real, self.initial)
        rows += _rows(step, self.real, measured)

        def write(tmp: Path) -> None:
            with open(tmp, "w", newline="") as f:
                csv.writer(f).writerows([_COLUMNS, *rows])

        atomic_write(path, write)
        table = read_spectra(path)
        title = f"{len(self.images)} images, step {step:,}"
        spectrum_evolution_plot(self.real, {s: e["generated"] for s, e in table.items()},
                                folder / "spectrum_evolution.png", title)  # fmt: skip
        spectral_error_evolution_plot({s: e["error"] for s, e in table.items()},
                                      folder / "spectral_error_evolution.png", title)  # fmt: skip
        shown = [[(t.clamp(-1, 1) * 0.5 + 0.5, what) for t in batch[:8]]
                 for batch, what in ((images, "generated"), (self.images, "target"))]  # fmt: skip
        titled_grid(shown, [f"image {i}" for i in range(len(shown[0]))], folder / "samples.png",
                    title=f"step {step:,}: each generated image above the image it regresses")  # fmt: skip

    def summary(self, last: dict[str, float], best: float | None) -> dict[str, Any]:
        untrained = {k.removeprefix("val_"): self.initial[k] for k in self.eval_columns}  # step 0, for comparisons
        return {"last_loss": last.get("loss", float("nan")), "best_psnr": best, "untrained": untrained, **self.last}
