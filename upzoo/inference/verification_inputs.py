"""The inputs an export is verified on: standard-normal values kept clear of the model's hard
thresholds, or smooth images for a model that declares it takes images in [0, 1]."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["verification_input", "threshold_margin", "THRESHOLD_MARGIN"]

THRESHOLD_MARGIN = 1e-5  # verification inputs keep this far from a masked blur's threshold (10x the rounding)


def threshold_margin(model: nn.Module, x: torch.Tensor) -> float:
    """The smallest ``|value - threshold|`` that a hard-threshold masked blur of ``model`` sees at
    input ``x`` (``inf`` where it has none): a value closer than two runtimes' rounding apart is
    blurred by one and kept by the other."""
    from upzoo.filters.masked_blur import MaskedGaussianBlur

    closest = [float("inf")]

    def measure(module: nn.Module, args: tuple) -> None:
        if module.options["soft"] is None and (len(args) < 2 or args[1] is None) and args[0].numel():
            closest[0] = min(closest[0], float((args[0] - module.options["threshold"]).abs().min()))

    blurs = [m for m in model.modules() if isinstance(m, MaskedGaussianBlur)]
    if not blurs:
        return float("inf")
    hooks = [m.register_forward_pre_hook(measure) for m in blurs]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return closest[0]


def verification_input(model: nn.Module, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """A standard-normal input of ``shape`` whose values at every hard threshold of the model stay
    :data:`THRESHOLD_MARGIN` clear of it (redrawn, up to 50 times), so that a comparison with
    another runtime measures the export, not which side of a threshold its rounding falls on.

    A model that declares ``input_range = (0.0, 1.0)`` (the SR networks with shipped weights, whose
    outputs on noise amplify every rounding) gets smooth random images in [0, 1] instead: uniform
    values on a grid 4 times coarser, interpolated bilinearly."""
    if tuple(getattr(model, "input_range", ())) == (0.0, 1.0):
        coarse = torch.rand(*shape[:2], *(-(-n // 4) + 1 for n in shape[2:]), generator=generator)
        return F.interpolate(coarse, size=shape[2:], mode="bilinear", align_corners=True)
    x = torch.randn(shape, generator=generator)
    for _ in range(49):
        if threshold_margin(model, x) > THRESHOLD_MARGIN:
            break
        x = torch.randn(shape, generator=generator)
    return x
