"""The masked blur's PyTorch formulation in eager mode: a separable sum of shifted slices evaluated
only at the blurred lattice, the decision blended with ``lerp``, and a hand-written backward (adjoint
shifts, PyTorch's own pad-backward kernels) — one autograd node that saves nothing but the input and
the user's mask. ``_HardVjp`` gives double backward for hard decisions."""

from __future__ import annotations

import torch

from upzoo.errors import ConfigError
from upzoo.filters.blur_plan import Plan, axis_slice, pad, unpad_grad

__all__ = ["MaskedBlurFunction"]


def _blur_at_lattice(xp: torch.Tensor, plan: Plan, out: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Separable blur of ``xp`` (padded unless ``valid``), evaluated at the lattice positions only.

    The last axis' pass writes into ``out`` when given. Returns the passes' results, the blurred
    lattice last; the earlier ones are scratch the caller may reuse."""
    t, results = xp, []
    last = len(plan.taps) - 1
    for axis, (taps, (_, count, step)) in enumerate(zip(plan.taps, plan.lattice)):
        dim, start = axis + 2, plan.window_start(axis)
        first = t[axis_slice(t.ndim, dim, start, count, step)]
        acc = torch.mul(first, taps[0], out=out) if (axis == last and out is not None) else first * taps[0]
        for j in range(1, len(taps)):
            acc.add_(t[axis_slice(t.ndim, dim, start + j, count, step)], alpha=taps[j])
        results.append(acc)
        t = acc
    return results


def _blur_at_lattice_adjoint(grad: torch.Tensor, plan: Plan, into: torch.Tensor) -> None:
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
            target[axis_slice(target.ndim, dim, start + j, count, step)].add_(grad, alpha=taps[j])
        grad = target


def _like_outside_lattice(src: torch.Tensor, plan: Plan) -> torch.Tensor:
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


def _forward(
    x: torch.Tensor, mask: torch.Tensor | None, plan: Plan, threshold: float, soft: float | None
) -> torch.Tensor:
    index = plan.index
    xs = x[index]
    mask_s = mask.expand(x.shape)[index] if mask is not None else None
    out = _like_outside_lattice(x, plan)
    target = out[index]
    passes = _blur_at_lattice(pad(x, plan), plan, out=target)  # the blur lands in the output
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
    plan: Plan,
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
        difference = _blur_at_lattice(pad(x, plan), plan)[-1] - xs
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
        grad_x += unpad_grad(grad_padded, x, plan)
    return grad_x, grad_mask


class MaskedBlurFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask, plan: Plan, threshold: float, soft: float | None):  # type: ignore[override]
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
    def forward(ctx, grad_out, x, mask, plan: Plan, threshold: float):  # type: ignore[override]
        ctx.save_for_backward(x, mask)
        ctx.plan, ctx.threshold = plan, threshold
        return _vjp(x, mask, grad_out, plan, threshold, None, False)[0]

    @staticmethod
    def backward(ctx, grad_grad):  # type: ignore[override]
        x, mask = ctx.saved_tensors
        decisions = mask if mask is not None else x >= ctx.threshold
        return MaskedBlurFunction.apply(grad_grad, decisions, ctx.plan, ctx.threshold, None), None, None, None, None
