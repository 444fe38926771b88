"""Gradient checkpointing that changes memory only: a checkpointed block's recomputation in the
backward must not update BatchNorm's running statistics a second time."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["checkpointed"]


@contextlib.contextmanager
def _restored_buffers(module: nn.Module) -> Iterator[None]:
    """Run a block and put ``module``'s buffers back as they were: the recomputation of a
    checkpointed forward must not update BatchNorm running statistics (and ``num_batches_tracked``)
    a second time. The recomputation itself normalises with batch statistics, as the forward did."""
    saved = [(b, b.clone()) for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def checkpointed(module: nn.Module, *args: torch.Tensor | None):
    """``module(*args)`` under gradient checkpointing that changes memory only: the backward's
    recomputation keeps BatchNorm running statistics as the forward left them."""
    return checkpoint(
        module, *args, use_reentrant=False, context_fn=lambda: (contextlib.nullcontext(), _restored_buffers(module))
    )
