"""Masked Gaussian blur: blur only the pixels at or above a threshold (or inside a mask).

The problem it solves: a generator that ends with a per-pixel Python loop blurring "bright" pixels
makes ``backward()`` take minutes. Here the blur is one autograd node that saves nothing but the
input (and the user's mask). Two implementations sit behind it, with the same results:

- a fused C kernel (``_masked_blur_cpu.c``, built at install when a C compiler is there) for the
  common case: contiguous float32/float64 CPU tensors with a hard threshold — one pass over memory
  for the forward, two for the backward;
- separable shift-and-add arithmetic over whole tensors in PyTorch for everything else (GPU, other
  dtypes and memory formats, ``mask``, ``soft``).

:data:`FUSED_CPU_KERNEL` says whether the kernel was built.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from upzoo.errors import ConfigError, ShapeError
from upzoo.filters.select_blur import select_blur
from upzoo.layers import refuse_jit_trace, to_ntuple
from upzoo.registry import register_upsampler
from upzoo.upsamplers.base import PostFilter

try:
    from upzoo.filters import _masked_blur_cpu as _cpu_kernel
except ImportError:  # built without a C compiler: the PyTorch formulation serves every call
    _cpu_kernel = None

__all__ = [
    "masked_gaussian_blur",
    "MaskedGaussianBlur",
    "gaussian_taps",
    "Border",
    "FUSED_CPU_KERNEL",
    "pytorch_formulation",
]

#: Whether the fused CPU kernel was built (``pip install`` compiles it when a C compiler is present).
FUSED_CPU_KERNEL = _cpu_kernel is not None


@contextlib.contextmanager
def pytorch_formulation():
    """Within this block every call runs the PyTorch formulation, even where the fused kernel would
    (for comparisons and benchmarks; not thread-safe).

    >>> with pytorch_formulation():
    ...     out = masked_gaussian_blur(torch.rand(1, 1, 8, 8), threshold=0.5)
    """
    global _cpu_kernel
    kernel, _cpu_kernel = _cpu_kernel, None
    try:
        yield
    finally:
        _cpu_kernel = kernel


Border = Literal["valid", "zeros", "reflect", "replicate"]
_BORDERS = ("valid", "zeros", "reflect", "replicate")
_PAD_BACKWARD = {
    ("reflect", 2): torch.ops.aten.reflection_pad2d_backward,
    ("reflect", 3): torch.ops.aten.reflection_pad3d_backward,
    ("replicate", 2): torch.ops.aten.replication_pad2d_backward,
    ("replicate", 3): torch.ops.aten.replication_pad3d_backward,
}


def gaussian_taps(kernel_size: int, sigma: float | None = None) -> tuple[float, ...]:
    """The normalised 1D Gaussian of odd length ``kernel_size``.

    ``sigma=None`` with ``kernel_size=3`` is ``[1, 2, 1] / 4`` (so the 2D kernel is the classic
    ``[1,2,1] x [1,2,1] / 16``); for other sizes ``sigma=None`` means ``0.3 * ((k - 1) / 2 - 1) + 0.8``
    (OpenCV's and torchvision's default).

    >>> gaussian_taps(3)
    (0.25, 0.5, 0.25)
    """
    if sigma is None:
        if kernel_size == 3:
            return (0.25, 0.5, 0.25)
        sigma = 0.3 * ((kernel_size - 1) * 0.5 - 1) + 0.8
    radius = kernel_size // 2
    weights = [math.exp(-(i * i) / (2.0 * sigma * sigma)) for i in range(-radius, radius + 1)]
    total = sum(weights)
    return tuple(w / total for w in weights)


@dataclass(frozen=True)
class _Plan:
    """Everything the blur needs besides the tensors, derived once from the options and the shape."""

    taps: tuple[tuple[float, ...], ...]  # per spatial axis
    border: Border
    pads: tuple[int, ...]  # k // 2 per spatial axis
    lattice: tuple[tuple[int, int, int], ...]  # (first, count, step) of blurred positions per axis

    @property
    def index(self) -> tuple[slice, ...]:
        """Index selecting the blurred positions of a ``(B, C, *S)`` tensor."""
        return (slice(None), slice(None)) + tuple(slice(f, f + s * (c - 1) + 1, s) for f, c, s in self.lattice)

    @property
    def pad_list(self) -> list[int]:
        """``F.pad`` order: last axis first."""
        return [p for p in reversed(self.pads) for _ in (0, 1)]

    def window_start(self, axis: int) -> int:
        """Index in the (padded, unless ``valid``) input of the first tap for the first position."""
        first = self.lattice[axis][0]
        return first - self.pads[axis] if self.border == "valid" else first


def _is_number(value: object, *, finite: bool = True) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return math.isfinite(value) or (not finite and not math.isnan(value))


def _check_options(
    n: int, kernel_size, sigma, border, stride, soft, threshold=0.0
) -> tuple[tuple[int, ...], tuple, tuple[int, ...]]:
    """Validate the shape-independent options; return per-axis kernel sizes, sigmas and strides."""
    if not _is_number(threshold, finite=False):
        raise ConfigError(f"threshold must be a number (inf and -inf allowed, not NaN), got {threshold!r}")
    sizes = to_ntuple(kernel_size, n, "kernel_size")
    if any(k % 2 == 0 for k in sizes):
        raise ConfigError(f"kernel_size must be odd on every axis, got {sizes}")
    sigmas = tuple(sigma) if isinstance(sigma, (tuple, list)) else (sigma,) * n
    if len(sigmas) != n or any(s is not None and not (_is_number(s) and s > 0) for s in sigmas):
        raise ConfigError(f"sigma must be None, a positive finite number or {n} of them, got {sigma!r}")
    if border not in _BORDERS:
        raise ConfigError(f"border must be one of {', '.join(_BORDERS)}, got {border!r}")
    steps = to_ntuple(stride, n, "stride")
    if soft is not None and not (_is_number(soft) and soft > 0):
        raise ConfigError(f"soft must be None or a positive finite temperature, got {soft!r}")
    return sizes, sigmas, steps


def _taps_and_steps(n: int, kernel_size, sigma, border, stride, soft, threshold=0.0) -> tuple[tuple, tuple[int, ...]]:
    """Check the options; return the per-axis Gaussian taps and strides."""
    sizes, sigmas, steps = _check_options(n, kernel_size, sigma, border, stride, soft, threshold)
    taps = tuple(gaussian_taps(k, float(sg) if sg is not None else None) for k, sg in zip(sizes, sigmas))
    return taps, steps


def _plan(spatial: Sequence[int], taps: tuple[tuple[float, ...], ...], border: str, steps: Sequence[int]) -> _Plan:
    pads = tuple(len(k) // 2 for k in taps)
    if border == "reflect" and any(p >= s for p, s in zip(pads, spatial)):
        raise ShapeError(
            f"border='reflect' needs every spatial size > kernel_size // 2 {pads}, got {tuple(spatial)}; "
            f"use border='replicate' or a smaller kernel"
        )
    lattice = []
    for size, p, s in zip(spatial, pads, steps):
        # positions r with r = p (mod s): the original loop's grid, starting at the first interior pixel
        start, stop = (p, size - p) if border == "valid" else (p % s, size)
        lattice.append((start, len(range(start, stop, s)), s))
    return _Plan(taps=taps, border=border, pads=pads, lattice=tuple(lattice))  # type: ignore[arg-type]


def _axis_slice(ndim: int, axis: int, start: int, count: int, step: int) -> tuple[slice, ...]:
    index = [slice(None)] * ndim
    index[axis] = slice(start, start + step * (count - 1) + 1, step)
    return tuple(index)


def _blur_at_lattice(xp: torch.Tensor, plan: _Plan, out: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Separable blur of ``xp`` (padded unless ``valid``), evaluated at the lattice positions only.

    The last axis' pass writes into ``out`` when given. Returns the passes' results, the blurred
    lattice last; the earlier ones are scratch the caller may reuse."""
    t, results = xp, []
    last = len(plan.taps) - 1
    for axis, (taps, (_, count, step)) in enumerate(zip(plan.taps, plan.lattice)):
        dim, start = axis + 2, plan.window_start(axis)
        first = t[_axis_slice(t.ndim, dim, start, count, step)]
        acc = torch.mul(first, taps[0], out=out) if (axis == last and out is not None) else first * taps[0]
        for j in range(1, len(taps)):
            acc.add_(t[_axis_slice(t.ndim, dim, start + j, count, step)], alpha=taps[j])
        results.append(acc)
        t = acc
    return results


def _blur_at_lattice_adjoint(grad: torch.Tensor, plan: _Plan, into: torch.Tensor) -> None:
    """Add the adjoint of :func:`_blur_at_lattice` applied to ``grad`` into ``into`` (shape of ``xp``)."""
    n = len(plan.taps)
    for axis in reversed(range(n)):
        dim, start = axis + 2, plan.window_start(axis)
        _, count, step = plan.lattice[axis]
        taps = plan.taps[axis]
        if axis == 0:
            target, first = into, 0
        else:  # the intermediate of the forward pass: lattice-sized on earlier axes, full on later ones
            shape = list(grad.shape)
            shape[dim] = into.shape[dim]
            if step == 1:  # the first tap writes [start, start + count); zero only what it leaves
                target = grad.new_empty(shape)
                target.narrow(dim, 0, start).zero_()
                target.narrow(dim, start + count, shape[dim] - start - count).zero_()
                torch.mul(grad, taps[0], out=target.narrow(dim, start, count))
                first = 1
            else:
                target, first = grad.new_zeros(shape), 0
        for j in range(first, len(taps)):
            target[_axis_slice(target.ndim, dim, start + j, count, step)].add_(grad, alpha=taps[j])
        grad = target


def _like_outside_lattice(src: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """A new tensor equal to ``src`` off the lattice; the lattice entries are left for the caller.

    For a box lattice (stride 1) only the border slabs are copied instead of the whole tensor."""
    if any(step != 1 for _, _, step in plan.lattice):
        return src.clone()
    out = torch.empty_like(src)
    for axis, (first, count, _) in enumerate(plan.lattice):
        dim, size = axis + 2, src.shape[axis + 2]
        for begin, length in ((0, first), (first + count, size - first - count)):
            if length:
                out.narrow(dim, begin, length).copy_(src.narrow(dim, begin, length))
    return out


def _pad(x: torch.Tensor, plan: _Plan) -> torch.Tensor:
    if plan.border == "valid" or not any(plan.pads):
        return x
    mode = "constant" if plan.border == "zeros" else plan.border
    return torch.nn.functional.pad(x, plan.pad_list, mode=mode)


def _unpad_grad(gp: torch.Tensor, x: torch.Tensor, plan: _Plan) -> torch.Tensor:
    if plan.border == "zeros":
        return gp[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in zip(plan.pads, x.shape[2:]))]
    return _PAD_BACKWARD[(plan.border, x.ndim - 2)](gp, x, plan.pad_list)


def _blend_weight(
    xs: torch.Tensor, mask_s: torch.Tensor | None, threshold: float, soft: float | None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Weight in [0, 1] of the blurred value at the lattice positions, in the input's dtype.

    Hard decisions are 0/1 floats rather than bools: on the CPU, comparisons into a float ``out``
    and ``lerp`` run several times faster than bool tensors and ``torch.where``.
    """
    if mask_s is not None:
        return mask_s.to(xs.dtype)
    if soft is None:
        return torch.ge(
            xs, threshold, out=out if out is not None else torch.empty_like(xs, memory_format=torch.contiguous_format)
        )
    return torch.sigmoid((xs - threshold) / soft)


_FUSED_MAX_TAPS = 64  # per axis, MAX_TAPS in _masked_blur_cpu.c


def _fused_applies(x: torch.Tensor, mask: torch.Tensor | None, taps: tuple, soft: float | None) -> bool:
    """Whether the fused CPU kernel handles this call (otherwise the PyTorch formulation does)."""
    return (
        _cpu_kernel is not None
        and max(len(k) for k in taps) <= _FUSED_MAX_TAPS
        and mask is None
        and soft is None
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and x.is_contiguous()
    )


def _fused_geometry(x: torch.Tensor, source: torch.Tensor, plan: _Plan, threshold: float) -> tuple:
    """The kernel's description of the call; a 2D input is 3D with depth 1 and a one-tap depth kernel."""
    lead = 3 - len(plan.taps)
    window = tuple(plan.window_start(axis) for axis in range(len(plan.taps)))
    return (
        x.shape[0] * x.shape[1],
        (1,) * lead + tuple(x.shape[2:]),
        (1,) * lead + tuple(source.shape[2:]),
        (0,) * lead + tuple(f for f, _, _ in plan.lattice),
        (1,) * lead + tuple(c for _, c, _ in plan.lattice),
        (1,) * lead + tuple(s for _, _, s in plan.lattice),
        (0,) * lead + window,
        *(((1.0,),) * lead + plan.taps),
        threshold,
        source is x,
    )


def _fused_forward(x: torch.Tensor, plan: _Plan, threshold: float) -> torch.Tensor:
    source = _pad(x, plan)
    out = torch.empty_like(x)
    geometry = _fused_geometry(x, source, plan, threshold)
    _cpu_kernel.forward(
        geometry, x.data_ptr(), source.data_ptr(), out.data_ptr(), x.dtype == torch.float64, torch.get_num_threads()
    )
    return out


def _fused_backward(x: torch.Tensor, grad_out: torch.Tensor, plan: _Plan, threshold: float) -> torch.Tensor:
    grad_out = grad_out.to(x.dtype).contiguous()  # e.g. the expanded ones of .sum().backward()
    grad_x = torch.empty_like(x)
    padded = plan.border != "valid" and any(plan.pads)
    grad_source = grad_x  # border="valid": the windows' gradient lands in grad_x itself
    if padded:
        grad_source = grad_x.new_empty([*x.shape[:2], *(s + 2 * p for s, p in zip(x.shape[2:], plan.pads))])
    geometry = _fused_geometry(x, grad_source if padded else x, plan, threshold)
    _cpu_kernel.backward(
        geometry,
        x.data_ptr(),
        grad_out.data_ptr(),
        grad_x.data_ptr(),
        grad_source.data_ptr(),
        x.dtype == torch.float64,
        torch.get_num_threads(),
    )
    if padded:
        grad_x += _unpad_grad(grad_source, x, plan)
    return grad_x


def _split_taps(flat: Sequence[float], kernel_size: Sequence[int]) -> tuple[tuple[float, ...], ...]:
    starts = [sum(kernel_size[:i]) for i in range(len(kernel_size))]
    return tuple(tuple(flat[a : a + k]) for a, k in zip(starts, kernel_size))


@torch.library.custom_op("upzoo::masked_blur", mutates_args=())
def fused_masked_blur(
    x: torch.Tensor, taps: list[float], kernel_size: list[int], border: str, stride: list[int], threshold: float
) -> torch.Tensor:
    """The fused CPU kernel as one opaque op for autograd, ``torch.compile`` and ``torch.export``
    (``taps``: the per-axis Gaussians, concatenated; ``kernel_size``: their lengths)."""
    x = x.contiguous()
    plan = _plan(x.shape[2:], _split_taps(taps, kernel_size), border, stride)
    if any(count == 0 for _, count, _ in plan.lattice):
        return x.clone()
    return _fused_forward(x, plan, threshold)


@torch.library.custom_op("upzoo::masked_blur_backward", mutates_args=())
def fused_masked_blur_backward(
    x: torch.Tensor,
    grad_out: torch.Tensor,
    taps: list[float],
    kernel_size: list[int],
    border: str,
    stride: list[int],
    threshold: float,
) -> torch.Tensor:
    """The input's gradient of :func:`fused_masked_blur` given the output's."""
    x = x.contiguous()
    plan = _plan(x.shape[2:], _split_taps(taps, kernel_size), border, stride)
    if any(count == 0 for _, count, _ in plan.lattice):
        return grad_out.to(x.dtype).clone()
    return _fused_backward(x, grad_out, plan, threshold)


@fused_masked_blur.register_fake
def _fused_masked_blur_fake(x, taps, kernel_size, border, stride, threshold):
    return torch.empty_like(x)


@fused_masked_blur_backward.register_fake
def _fused_masked_blur_backward_fake(x, grad_out, taps, kernel_size, border, stride, threshold):
    return torch.empty_like(x)


def _save_input(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])  # the input only: nothing new is kept
    ctx.options = inputs[-5:]


def _fused_vjp(ctx, grad_out):
    (x,) = ctx.saved_tensors
    return fused_masked_blur_backward(x, grad_out, *ctx.options), None, None, None, None, None


def _save_decisions(ctx, inputs, output) -> None:
    x, _, taps, kernel_size, border, stride, threshold = inputs
    ctx.save_for_backward(x >= threshold)
    ctx.options = (_split_taps(taps, kernel_size), border, stride)


def _fused_vjp_vjp(ctx, grad_grad):
    """With the decisions fixed the filter is linear, ``y = J x``, so its gradient ``J^T g`` has
    derivative ``J`` in ``g`` (the blur with the decisions as its mask) and none in ``x``."""
    (decisions,) = ctx.saved_tensors
    taps, border, stride = ctx.options
    return None, select_blur(grad_grad, decisions, taps, border, stride, 0.0, None), None, None, None, None, None


fused_masked_blur.register_autograd(_fused_vjp, setup_context=_save_input)
fused_masked_blur_backward.register_autograd(_fused_vjp_vjp, setup_context=_save_decisions)


def _forward(
    x: torch.Tensor, mask: torch.Tensor | None, plan: _Plan, threshold: float, soft: float | None
) -> torch.Tensor:
    index = plan.index
    xs = x[index]
    mask_s = mask.expand(x.shape)[index] if mask is not None else None
    out = _like_outside_lattice(x, plan)
    target = out[index]
    passes = _blur_at_lattice(_pad(x, plan), plan, out=target)  # the blur lands in the output
    # the first pass is free now: a view of it, shaped like the lattice, holds the hard decisions
    scratch = passes[0][tuple(slice(0, n) for n in xs.shape)] if mask is None and soft is None else None
    weight = _blend_weight(xs, mask_s, threshold, soft, out=scratch)
    hard = soft is None and (mask is None or mask.dtype == torch.bool)
    if hard and (x.device.type != "cpu" or not torch.isfinite(x.sum())):
        # an exact select: lerp would turn a kept pixel next to an inf or NaN into NaN (0 * inf);
        # off the CPU torch.where is as fast as lerp anyway
        torch.where(weight.bool(), target, xs, out=target)
    else:
        # lerp is exact at weights 0 and 1 for finite values (and bool/where are slow on the CPU)
        torch.lerp(xs, target, weight, out=target)
    return out


def _vjp(
    x: torch.Tensor,
    mask: torch.Tensor | None,
    grad_out: torch.Tensor,
    plan: _Plan,
    threshold: float,
    soft: float | None,
    mask_needs_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gradients of the input and of a float mask, given the output's."""
    index = plan.index
    xs, gs = x[index], grad_out[index]
    mask_s = mask.expand(x.shape)[index] if mask is not None else None
    w = _blend_weight(xs, mask_s, threshold, soft)
    w_is_scratch = mask is None and soft is None  # a fresh 0/1 tensor not needed after this
    grad_blur = w.mul_(gs) if w_is_scratch else gs * w
    grad_x = _like_outside_lattice(grad_out, plan)
    torch.sub(gs, grad_blur, out=grad_x[index])  # kept share of the direct path: gs * (1 - w)
    grad_mask = None
    if soft is not None or mask_needs_grad:
        difference = _blur_at_lattice(_pad(x, plan), plan)[-1] - xs
        if soft is not None:  # d w / d x through the sigmoid
            grad_x[index].add_(gs * difference * (w * (1 - w) / soft))
        if mask_needs_grad:
            full = torch.zeros_like(x)
            full[index] = gs * difference
            grad_mask = full.sum_to_size(mask.shape)
    if plan.border == "valid" or not any(plan.pads):
        _blur_at_lattice_adjoint(grad_blur, plan, into=grad_x)
    else:
        grad_padded = grad_x.new_zeros([*x.shape[:2], *(s + 2 * p for s, p in zip(x.shape[2:], plan.pads))])
        _blur_at_lattice_adjoint(grad_blur, plan, into=grad_padded)
        grad_x += _unpad_grad(grad_padded, x, plan)
    return grad_x, grad_mask


class _MaskedBlurFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask, plan: _Plan, threshold: float, soft: float | None):  # type: ignore[override]
        ctx.save_for_backward(x, mask)  # the input (and the user's mask): nothing new is kept
        ctx.plan, ctx.threshold, ctx.soft = plan, threshold, soft
        return _forward(x, mask, plan, threshold, soft)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        x, mask = ctx.saved_tensors
        plan, threshold, soft = ctx.plan, ctx.threshold, ctx.soft
        if torch.is_grad_enabled():  # create_graph=True: the gradient must itself be differentiable
            if soft is not None or (mask is not None and mask.is_floating_point()):
                raise ConfigError(
                    "masked_gaussian_blur supports double backward (create_graph=True) for a hard threshold or a "
                    "bool mask; got " + ("soft=" + repr(soft) if soft is not None else "a float mask")
                )
            return _HardVjp.apply(grad_out, x, mask, plan, threshold), None, None, None, None
        mask_needs_grad = mask is not None and ctx.needs_input_grad[1]
        grad_x, grad_mask = _vjp(x, mask, grad_out, plan, threshold, soft, mask_needs_grad)
        return grad_x, grad_mask, None, None, None


class _HardVjp(torch.autograd.Function):
    """The hard-decision gradient as a differentiable function of the output's gradient ``g``.

    With the decisions fixed the filter is linear, ``y = J x``, so the gradient ``J^T g`` has
    derivative ``J`` in ``g`` (the same filter with the decisions as a mask) and none in ``x``."""

    @staticmethod
    def forward(ctx, grad_out, x, mask, plan: _Plan, threshold: float):  # type: ignore[override]
        ctx.save_for_backward(x, mask)
        ctx.plan, ctx.threshold = plan, threshold
        return _vjp(x, mask, grad_out, plan, threshold, None, False)[0]

    @staticmethod
    def backward(ctx, grad_grad):  # type: ignore[override]
        x, mask = ctx.saved_tensors
        decisions = mask if mask is not None else x >= ctx.threshold
        return _MaskedBlurFunction.apply(grad_grad, decisions, ctx.plan, ctx.threshold, None), None, None, None, None


def masked_gaussian_blur(
    x: torch.Tensor,
    *,
    threshold: float = 0.0,
    mask: torch.Tensor | None = None,
    kernel_size: int | Sequence[int] = 3,
    sigma: float | Sequence[float] | None = None,
    border: Border = "valid",
    stride: int | Sequence[int] = 1,
    soft: float | None = None,
) -> torch.Tensor:
    """Replace each pixel whose value is ``>= threshold`` (or where ``mask``) by the Gaussian blur of
    its neighbourhood; the blur always reads the unmodified input. Per channel, 2D or 3D.

    ``(B, C, *S) -> (B, C, *S)``, same dtype and memory format.

    Args:
        x: ``(B, C, H, W)`` or ``(B, C, D, H, W)`` floating-point tensor.
        threshold: pixels with ``x >= threshold`` are blurred (ignored when ``mask`` is given).
        mask: bool tensor broadcastable to ``x`` choosing the pixels to blur, or a float tensor of
            blend weights in [0, 1] (differentiable).
        kernel_size: odd size, int or per axis. ``sigma=None`` with 3 is ``[1,2,1] x [1,2,1] / 16``.
        sigma: Gaussian sigma (int/float or per axis); ``None`` as in :func:`gaussian_taps`.
        border: ``valid`` leaves the outer ring of ``kernel_size // 2`` pixels untouched (exactly the
            classic loop); ``zeros``, ``reflect`` and ``replicate`` pad the input to blur every pixel.
        stride: blur only the pixels on the grid ``r = kernel_size // 2 (mod stride)`` per axis, the
            grid of the classic loop stepping by ``stride``; the output keeps the input's shape.
        soft: temperature ``T``: blend with weight ``sigmoid((x - threshold) / T)`` so the threshold
            decision itself is differentiable.

    On the CPU, contiguous float32/float64 input with a hard threshold runs the fused C kernel when
    it was built (:data:`FUSED_CPU_KERNEL`); everything else runs the PyTorch formulation. Both give
    the same values and gradients. Double backward (``create_graph=True``) works for a hard threshold
    or a bool mask.

    Raises:
        ShapeError: not a 4D/5D tensor, mask not broadcastable, too small for ``reflect``.
        ConfigError: bad kernel size, sigma, border, stride, soft, or non-float input.

    >>> x = torch.tensor([[[[0., 0, 0], [0, 4, 0], [0, 0, 0]]]])
    >>> masked_gaussian_blur(x, threshold=1.0)[0, 0, 1, 1].item()
    1.0
    """
    _check_tensors(x, mask, soft)
    taps, steps = _taps_and_steps(x.ndim - 2, kernel_size, sigma, border, stride, soft, threshold)
    return _blur(x, mask, taps, border, steps, float(threshold), None if soft is None else float(soft))


def _check_tensors(x: torch.Tensor, mask: torch.Tensor | None, soft: float | None) -> None:
    refuse_jit_trace("masked_gaussian_blur")
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"masked_gaussian_blur expects a torch.Tensor, got {type(x).__name__}")
    if x.ndim not in (4, 5):
        raise ShapeError(
            f"masked_gaussian_blur expects (B, C, H, W) or (B, C, D, H, W), got {x.ndim} dims {tuple(x.shape)}; "
            f"add batch/channel axes with x[None] or x[None, None]"
        )
    if not x.is_floating_point():
        raise ConfigError(f"masked_gaussian_blur expects a floating-point tensor, got {x.dtype}; use x.float()")
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise ConfigError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        try:
            broadcast = torch.broadcast_shapes(mask.shape, x.shape)
        except RuntimeError:
            broadcast = None
        if broadcast != x.shape:
            raise ShapeError(f"mask of shape {tuple(mask.shape)} does not broadcast to the input {tuple(x.shape)}")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise ConfigError(f"mask must be bool (hard) or floating (blend weights), got {mask.dtype}")
        if mask.is_floating_point() and mask.numel() and not torch.compiler.is_compiling():
            low, high = torch.aminmax(mask.detach())
            if not (bool(torch.isfinite(low)) and bool(torch.isfinite(high)) and low >= 0 and high <= 1):
                raise ConfigError(
                    f"a float mask holds blend weights in [0, 1], got values in [{float(low):.4g}, {float(high):.4g}]"
                    f"{' (NaN)' if bool(torch.isnan(mask).any()) else ''}; clamp or rescale it"
                )
        if soft is not None:
            raise ConfigError(
                "soft applies to the threshold; with a mask, pass float blend weights as the mask instead"
            )


def _blur(x: torch.Tensor, mask: torch.Tensor | None, taps: tuple, border: str, steps: tuple, threshold: float, soft):
    """The blur with checked options: the fused op where it applies (eager, compile and
    ``torch.export`` alike), the select formulation when traced otherwise or exported to ONNX, and
    the lean shift-and-add autograd function in eager."""
    if _fused_applies(x, mask, taps, soft) and not torch.onnx.is_in_onnx_export():
        flat = [t for k in taps for t in k]
        return fused_masked_blur(x, flat, [len(k) for k in taps], border, list(steps), threshold)
    if torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export():
        return select_blur(x, mask, taps, border, steps, threshold, soft)
    plan = _plan(x.shape[2:], taps, border, steps)
    if any(count == 0 for _, count, _ in plan.lattice):
        return x.clone()  # nothing to blur (input smaller than the kernel with border='valid')
    return _MaskedBlurFunction.apply(x, mask, plan, threshold, soft)


class MaskedGaussianBlur(PostFilter):
    """Module form of :func:`masked_gaussian_blur` (same arguments, fixed at construction); a
    post-filter of the upsampler contract (scale 1, channels kept).

    ``(B, C, *S) -> (B, C, *S)``. ``spatial_dims`` and ``channels`` (optional) are checked on input.

    >>> blur = MaskedGaussianBlur(threshold=0.5)
    >>> blur(torch.rand(2, 3, 16, 16)).shape
    torch.Size([2, 3, 16, 16])
    """

    def __init__(
        self,
        *,
        threshold: float = 0.0,
        kernel_size: int | Sequence[int] = 3,
        sigma: float | Sequence[float] | None = None,
        border: Border = "valid",
        stride: int | Sequence[int] = 1,
        soft: float | None = None,
        spatial_dims: int = 2,
        channels: int | None = None,
    ) -> None:
        super().__init__(spatial_dims=spatial_dims, channels=channels)
        self.options = dict(
            threshold=threshold, kernel_size=kernel_size, sigma=sigma, border=border, stride=stride, soft=soft
        )
        # checked now, not at forward
        self._taps, self._steps = _taps_and_steps(spatial_dims, kernel_size, sigma, border, stride, soft, threshold)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        self.output_shape(x.shape)
        return self.upsample(x, mask)

    def upsample(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        _check_tensors(x, mask, self.options["soft"])
        soft = self.options["soft"]
        threshold, soft = float(self.options["threshold"]), None if soft is None else float(soft)
        return _blur(x, mask, self._taps, self.options["border"], self._steps, threshold, soft)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


@register_upsampler("masked_blur", kind="post_filter", spatial_dims=(2, 3))
def masked_blur_filter(
    *,
    spatial_dims: int,
    in_channels: int,
    out_channels: int,
    scale: int | Sequence[int] = 1,
    threshold: float = 0.0,
    kernel_size: int | Sequence[int] = 3,
    sigma: float | Sequence[float] | None = None,
    border: Border = "valid",
    stride: int | Sequence[int] = 1,
    soft: float | None = None,
) -> MaskedGaussianBlur:
    """Masked Gaussian blur post-filter: blur pixels >= threshold, keep the rest (scale 1)."""
    if spatial_dims not in (2, 3):
        raise ConfigError(f"masked_blur supports spatial_dims 2 or 3, got {spatial_dims!r}")
    if to_ntuple(scale, spatial_dims, "scale") != (1,) * spatial_dims:
        raise ConfigError(f"masked_blur is a post-filter and keeps the size: scale must be 1, got {scale!r}")
    if in_channels != out_channels:
        raise ConfigError(
            f"masked_blur keeps the channels: out_channels must equal in_channels ({in_channels}), got {out_channels}"
        )
    return MaskedGaussianBlur(
        threshold=threshold,
        kernel_size=kernel_size,
        sigma=sigma,
        border=border,
        stride=stride,
        soft=soft,
        spatial_dims=spatial_dims,
        channels=in_channels,
    )
