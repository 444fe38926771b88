"""The fused CPU kernel of the masked blur (``_masked_blur_cpu.c``, built at install when a C
compiler is there) as the PyTorch custom ops ``upzoo::masked_blur`` and ``upzoo::masked_blur_backward``
with fake implementations and registered autograd (double backward included), and the rule for
when it applies: contiguous float32/float64 CPU tensors with a hard threshold."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from upzoo.filters.blur_plan import Plan, make_plan, pad, unpad_grad
from upzoo.filters.select_blur import select_blur

try:
    from upzoo.filters import _masked_blur_cpu as _cpu_kernel
except ImportError:  # built without a C compiler: the PyTorch formulation serves every call
    _cpu_kernel = None

__all__ = [
    "FUSED_CPU_KERNEL",
    "pytorch_formulation",
    "fused_applies",
    "fused_masked_blur",
    "fused_masked_blur_backward",
]

#: Whether the fused CPU kernel was built (``pip install`` compiles it when a C compiler is present).
FUSED_CPU_KERNEL = _cpu_kernel is not None


@contextlib.contextmanager
def pytorch_formulation():
    """Within this block every call runs the PyTorch formulation, even where the fused kernel would
    (for comparisons and benchmarks; not thread-safe).

    >>> from upzoo import masked_gaussian_blur
    >>> with pytorch_formulation():
    ...     out = masked_gaussian_blur(torch.rand(1, 1, 8, 8), threshold=0.5)
    """
    global _cpu_kernel
    kernel, _cpu_kernel = _cpu_kernel, None
    try:
        yield
    finally:
        _cpu_kernel = kernel


_FUSED_MAX_TAPS = 64  # per axis, MAX_TAPS in _masked_blur_cpu.c


def fused_applies(x: torch.Tensor, mask: torch.Tensor | None, taps: tuple, soft: float | None) -> bool:
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


def _fused_geometry(x: torch.Tensor, source: torch.Tensor, plan: Plan, threshold: float) -> tuple:
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


def _fused_forward(x: torch.Tensor, plan: Plan, threshold: float) -> torch.Tensor:
    source = pad(x, plan)
    out = torch.empty_like(x)
    geometry = _fused_geometry(x, source, plan, threshold)
    _cpu_kernel.forward(
        geometry, x.data_ptr(), source.data_ptr(), out.data_ptr(), x.dtype == torch.float64, torch.get_num_threads()
    )
    return out


def _fused_backward(x: torch.Tensor, grad_out: torch.Tensor, plan: Plan, threshold: float) -> torch.Tensor:
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
        grad_x += unpad_grad(grad_source, x, plan)
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
    plan = make_plan(x.shape[2:], _split_taps(taps, kernel_size), border, stride)
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
    plan = make_plan(x.shape[2:], _split_taps(taps, kernel_size), border, stride)
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
