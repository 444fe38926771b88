"""TensorFlow "same" padding made static for export.

timm's ``tf_*`` encoders (the ImageNet EfficientNet-Lite among them) pad their strided convolutions
as TensorFlow does, by an amount computed from each input's size (``Conv2dSame``). Traced with
dynamic sizes, that arithmetic grows into symbolic expressions that ``torch.export`` does not finish
simplifying (a FPN on EfficientNet-Lite0 ran for over 15 minutes). Where the input of such a
convolution is a multiple of its stride, the amount is a constant, ``(k - 1) * d + 1 - s``, split
as TensorFlow splits it (the smaller half before): upzoo's encoders take inputs padded to a multiple
of their output stride, so every strided convolution sees such an input. The export replaces each
``Conv2dSame`` with that constant padding, checks the result equals the model, and exports it.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from timm.layers.conv2d_same import Conv2dSame
from torch import nn

__all__ = ["StaticSameConv2d", "with_static_same_padding"]


class StaticSameConv2d(nn.Conv2d):
    """A ``Conv2dSame`` of timm with its padding fixed for inputs that are a multiple of the stride."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__(
            conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, 0, conv.dilation, conv.groups,
            conv.bias is not None, device=conv.weight.device, dtype=conv.weight.dtype,
        )  # fmt: skip
        self.load_state_dict(conv.state_dict())
        pads = []
        for k, s, d in zip(conv.kernel_size, conv.stride, conv.dilation):
            total = max((k - 1) * d + 1 - s, 0)
            pads.append((total // 2, total - total // 2))
        (top, bottom), (left, right) = pads
        self.same = (left, right, top, bottom)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.pad(x, self.same), self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


def with_static_same_padding(model: nn.Module) -> nn.Module:
    """``model`` itself when it has no ``Conv2dSame``, else a copy with each replaced by a
    :class:`StaticSameConv2d` (the model is left as it is)."""
    names = [name for name, module in model.named_modules() if isinstance(module, Conv2dSame)]
    if not names:
        return model
    static = copy.deepcopy(model)
    for name in names:
        parent_name, _, attribute = name.rpartition(".")
        parent = static.get_submodule(parent_name) if parent_name else static
        setattr(parent, attribute, StaticSameConv2d(getattr(parent, attribute)))
    return static
