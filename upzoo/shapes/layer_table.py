"""A per-layer table of any ``nn.Module`` for one input shape, computed on the meta device: shapes
only, no memory for activations or weights and no arithmetic."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from upzoo.errors import ShapeError

__all__ = ["TraceRow", "trace", "to_meta", "layer_modules"]


@dataclass(frozen=True)
class TraceRow:
    """One executed layer: its qualified name, class, input and output shapes and own parameters."""

    name: str
    layer: str
    input_shape: tuple[int, ...] | None
    output_shape: tuple[int, ...] | None
    params: int


def to_meta(model: nn.Module) -> nn.Module:
    """``model`` itself if it already lives on the meta device, else a meta copy (weights not kept)."""
    tensors = list(model.parameters()) + list(model.buffers())
    if tensors and all(t.is_meta for t in tensors):
        return model
    with torch.device("meta"):
        clone = copy.deepcopy(model.to("meta") if not tensors else _meta_copy(model))
    return clone


def _meta_copy(model: nn.Module) -> nn.Module:
    memo = {id(t): torch.empty_like(t, device="meta") for t in list(model.parameters()) + list(model.buffers())}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(memo[id(p)], requires_grad=p.requires_grad)
    return copy.deepcopy(model, memo)


def layer_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules a trace reports: leaves, and registered blocks as a whole (not their insides)."""
    from upzoo.upsamplers.base import Upsampler

    layers, inside = [], []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        if isinstance(module, Upsampler):  # registered blocks and post-filters as a whole
            inside.append(name)
            layers.append((name, module))
        elif not any(True for _ in module.children()):
            layers.append((name, module))
    return layers


def _shape(value: object) -> tuple[int, ...] | None:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def trace(model: nn.Module, input_shape: Sequence[int]) -> list[TraceRow]:
    """Run ``model`` on the meta device for an input of ``input_shape`` and list every executed layer
    in order (a layer called twice appears twice).

    Raises:
        ShapeError: the model cannot run on this shape (with PyTorch's reason).
    """
    meta = to_meta(model).eval()
    rows: list[TraceRow] = []
    handles = []
    for name, module in layer_modules(meta):
        params = sum(p.numel() for p in module.parameters())

        def hook(mod, args, output, name=name, params=params):
            rows.append(TraceRow(name, type(mod).__name__, _shape(args[0]) if args else None, _shape(output), params))

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            meta(torch.empty(tuple(input_shape), device="meta"))
    except ShapeError:
        raise
    except (RuntimeError, ValueError, IndexError) as exc:
        raise ShapeError(f"the model cannot run on input {tuple(input_shape)}: {str(exc).splitlines()[0]}") from None
    finally:
        for handle in handles:
            handle.remove()
    return rows
