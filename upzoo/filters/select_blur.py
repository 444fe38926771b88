"""The masked blur as a select between the input and a depthwise Gaussian blur: branch-free on data
and on sizes, made of ops every tracer knows (pad, conv, arange, where, lerp).

This is the formulation ``torch.compile`` traces where the fused CPU kernel does not apply, and the
one every ONNX graph of the blur holds: autograd differentiates it directly, and with symbolic
sizes it specialises nothing. :func:`~upzoo.filters.masked_blur.masked_gaussian_blur` picks it; the
eager path keeps its leaner shift-and-add arithmetic (same values, less memory).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["select_blur"]

_CONV = {2: F.conv2d, 3: F.conv3d}
_PAD_MODE = {"valid": "constant", "zeros": "constant", "reflect": "reflect", "replicate": "replicate"}


def _depthwise_blur(x: torch.Tensor, taps: Sequence[Sequence[float]], border: str) -> torch.Tensor:
    """Every pixel's separable Gaussian blur, padded per ``border`` (``valid``: zeros, whose
    results the lattice then leaves out)."""
    n, spatial = x.ndim - 2, x.shape[2:]
    t = x.reshape(-1, 1, *spatial)
    pads = [len(k) // 2 for k in taps]
    if any(pads):
        t = F.pad(t, [p for p in reversed(pads) for _ in (0, 1)], mode=_PAD_MODE[border])
    for axis, k in enumerate(taps):
        shape = [1, 1] + [1] * n
        shape[2 + axis] = len(k)
        weight = torch.tensor(k, dtype=x.dtype, device=x.device).reshape(shape)
        t = _CONV[n](t, weight)
    return t.reshape(x.shape)


def _on_lattice(x: torch.Tensor, pads: Sequence[int], steps: Sequence[int], border: str) -> torch.Tensor:
    """Bool ``(1, 1, *S)`` broadcastable: the positions the blur may change (the stride grid
    ``r = pad (mod step)``, and with ``valid`` only the interior)."""
    keep = None
    for axis, (pad, step) in enumerate(zip(pads, steps)):
        size = x.shape[2 + axis]
        r = torch.arange(size, device=x.device)
        first = pad if border == "valid" else pad % step
        on_axis = (r >= first) & ((r - first) % step == 0)
        if border == "valid":
            on_axis = on_axis & (r < size - pad)
        shape = [1] * x.ndim
        shape[2 + axis] = -1
        on_axis = on_axis.reshape(shape)
        keep = on_axis if keep is None else keep & on_axis
    return keep


def select_blur(
    x: torch.Tensor,
    mask: torch.Tensor | None,
    taps: Sequence[Sequence[float]],
    border: str,
    steps: Sequence[int],
    threshold: float,
    soft: float | None,
) -> torch.Tensor:
    """``where(decision, blur(x), x)`` on the lattice, or the blend ``lerp(x, blur(x), weight)`` for
    a float mask or a soft threshold. Options as checked by ``masked_gaussian_blur``."""
    blurred = _depthwise_blur(x, taps, border)
    on = _on_lattice(x, [len(k) // 2 for k in taps], steps, border)
    if mask is None and soft is None:
        return torch.where((x >= threshold) & on, blurred, x)
    if mask is not None and mask.dtype == torch.bool:
        return torch.where(mask & on, blurred, x)
    weight = mask.to(x.dtype) if mask is not None else torch.sigmoid((x - threshold) / soft)
    return torch.lerp(x, blurred, weight * on)
