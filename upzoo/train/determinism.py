"""``train.deterministic: true``: the same run, bit for bit, on the same machine — and a clear word
before any work when a model cannot be trained so on CUDA.

PyTorch's deterministic mode (``torch.use_deterministic_algorithms(True)``, cuDNN's benchmark off,
``CUBLAS_WORKSPACE_CONFIG=:4096:8``) raises a ``RuntimeError`` at the first operation whose CUDA
backward only has a non-deterministic kernel — mid-step, as a traceback. upzoo instead finds those
operations before training: it runs each module once on the meta device (shapes only, no memory,
no arithmetic) and records the ATen operators it calls with the module that called them. On CUDA a
model that uses any of them is refused in one line naming the module, the block and the operator
(bilinear interpolation in the ``interpolate`` block or smp's decoders, ``grid_sample`` in
DySample, adaptive pooling in UPerNet's pyramid, ...), with the fix: a block that avoids it
(``interpolate`` with ``mode: nearest``, ``pixel_shuffle``, ``transposed``, ``carafe``) or
``train.deterministic: false``. On the CPU every kernel is deterministic and nothing is refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from upzoo.errors import ConfigError
from upzoo.shapes.layer_table import to_meta

__all__ = [
    "NO_DETERMINISTIC_CUDA_BACKWARD",
    "nondeterministic_cuda_ops",
    "use_deterministic",
    "restore_deterministic",
    "check_deterministic",
]

#: ATen operators whose CUDA backward (or forward) has no deterministic kernel (PyTorch 2.14's
#: ``torch.use_deterministic_algorithms`` list), with the words a user knows them by
NO_DETERMINISTIC_CUDA_BACKWARD = {
    "upsample_linear1d": "linear interpolation",
    "upsample_bilinear2d": "bilinear interpolation",
    "_upsample_bilinear2d_aa": "antialiased bilinear interpolation",
    "upsample_bicubic2d": "bicubic interpolation",
    "_upsample_bicubic2d_aa": "antialiased bicubic interpolation",
    "upsample_trilinear3d": "trilinear interpolation",
    "grid_sampler_2d": "grid_sample",
    "grid_sampler_3d": "grid_sample",
    "_adaptive_avg_pool2d": "adaptive average pooling",
    "_adaptive_avg_pool3d": "adaptive average pooling",
    "adaptive_max_pool2d": "adaptive max pooling",
    "avg_pool3d": "3D average pooling",
    "fractional_max_pool2d": "fractional max pooling",
    "fractional_max_pool3d": "fractional max pooling",
    "max_unpool2d": "max unpooling",
    "max_unpool3d": "max unpooling",
    "reflection_pad1d": "reflection padding",
    "reflection_pad2d": "reflection padding",
    "reflection_pad3d": "reflection padding",
    "nll_loss2d_forward": "2D NLL loss",
    "histc": "histc",
}


class _Recorder(TorchDispatchMode):
    """Notes every listed operator with the innermost module running when it was called."""

    def __init__(self, stack: list[str]) -> None:
        super().__init__()
        self.stack, self.found = stack, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        what = NO_DETERMINISTIC_CUDA_BACKWARD.get(func._overloadpacket.__name__)
        if what is not None:
            self.found.setdefault(self.stack[-1] if self.stack else "(top level)", set()).add(what)
        return func(*args, **(kwargs or {}))


def _label(name: str, module: nn.Module) -> str:
    from upzoo.registry import UPSAMPLERS

    block = next((key for key in UPSAMPLERS.names() if type(module) is UPSAMPLERS.info(key).factory), None)
    return f"{name or '(model)'} ({block or type(module).__name__})"


def nondeterministic_cuda_ops(module: nn.Module, *inputs: Sequence[int]) -> dict[str, list[str]]:
    """``{module (block): [operators]}`` for every operator without a deterministic CUDA kernel that
    ``module`` calls on inputs of these shapes (run on the meta device, in training mode)."""
    meta = to_meta(module).train()
    stack: list[str] = []
    handles = []

    def leave(module: nn.Module, args: tuple, output: object) -> None:
        stack.pop()  # a hook that returned the label would replace the module's output

    for name, sub in meta.named_modules():
        label = _label(name, sub)
        handles.append(sub.register_forward_pre_hook(lambda m, a, label=label: stack.append(label) and None))
        handles.append(sub.register_forward_hook(leave))
    recorder = _Recorder(stack)
    try:
        with torch.no_grad(), recorder:
            meta(*(torch.empty(tuple(shape), device="meta") for shape in inputs))
    finally:
        for handle in handles:
            handle.remove()
    return {where: sorted(ops) for where, ops in recorder.found.items()}


def use_deterministic(enabled: bool) -> tuple[bool, bool, bool]:
    """PyTorch's deterministic mode on or off, with the cuBLAS workspace setting it needs (set before
    CUDA's first matrix product) and cuDNN's autotuner off; returns the previous settings, for
    :func:`restore_deterministic`."""
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return previous


def restore_deterministic(previous: tuple[bool, bool, bool]) -> None:
    """Put back what :func:`use_deterministic` found (a run leaves the process as it was)."""
    torch.use_deterministic_algorithms(previous[0])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = previous[1], previous[2]


def check_deterministic(modules: Mapping[str, nn.Module], inputs: Mapping[str, tuple], device: torch.device) -> None:
    """Refuse, before any work, a CUDA run of ``train.deterministic: true`` whose modules call an
    operator without a deterministic CUDA kernel (see the module); a no-op on the CPU.

    Raises:
        ConfigError: naming the first module, its block, the operator and the fix.
    """
    if device.type != "cuda":
        return
    for name, module in modules.items():
        found = nondeterministic_cuda_ops(module, *inputs[name])
        if found:
            where, ops = next(iter(found.items()))
            more = f" (and {len(found) - 1} more module(s))" if len(found) > 1 else ""
            raise ConfigError(
                f"train.deterministic: true on CUDA, but the {name}'s {where} uses {', '.join(ops)}, whose CUDA "
                f"backward has no deterministic kernel{more}; choose a block without it (e.g. interpolate with "
                "mode: nearest, pixel_shuffle, transposed, carafe) or set train.deterministic: false"
            )
