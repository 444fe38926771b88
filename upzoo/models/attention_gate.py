"""Attention gates on a U-Net's skips (Oktay et al. 2018, "Attention U-Net: Learning Where to Look for
the Pancreas"): the upsampled decoder features decide, voxel by voxel, how much of the encoder skip
passes into the decoder stage. A decoder option (``UNet(attention_gates=True)``), not a block: it
works after any registered upsampler, 2D and 3D."""

from __future__ import annotations

import torch
from torch import nn

from upzoo.errors import ShapeError
from upzoo.layers import conv_nd
from upzoo.models.blocks import make_norm

__all__ = ["AttentionGate"]


class AttentionGate(nn.Module):
    """``gate (B, C_g, *S), skip (B, C_x, *S) -> skip * alpha``, ``alpha (B, 1, *S)`` in (0, 1):

    ``alpha = sigmoid(N(psi(relu(N(W_g gate) + N(W_x skip)))))`` with ``W_g``, ``W_x`` 1x1 convs to
    ``inter_channels`` (half the skip's channels by default, as MONAI's ``AttentionUnet``), ``psi`` a
    1x1 conv to one channel, ``N`` the normalisation (BatchNorm: MONAI's and the paper's). The gate is
    the decoder's upsampled features at the skip's resolution (MONAI's ``AttentionBlock(g, x)``; its
    weights load one to one, tested).

    Raises:
        ShapeError: a gate whose batch or spatial size differs from the skip's.
    """

    def __init__(
        self, spatial_dims: int, gate_channels: int, skip_channels: int, inter_channels: int | None = None,
        norm: str = "batch",
    ) -> None:  # fmt: skip
        super().__init__()
        conv, inter = conv_nd(spatial_dims), inter_channels or max(1, skip_channels // 2)
        self.W_g = nn.Sequential(conv(gate_channels, inter, 1), make_norm(norm, spatial_dims, inter))
        self.W_x = nn.Sequential(conv(skip_channels, inter, 1), make_norm(norm, spatial_dims, inter))
        self.psi = nn.Sequential(conv(inter, 1, 1), make_norm(norm, spatial_dims, 1), nn.Sigmoid())
        self.relu = nn.ReLU()

    def coefficients(self, gate: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        """``alpha (B, 1, *S)``: how much of the skip passes at each position."""
        if gate.shape[0] != skip.shape[0] or gate.shape[2:] != skip.shape[2:]:
            raise ShapeError(
                f"AttentionGate: the upsampled features {tuple(gate.shape)} and the skip {tuple(skip.shape)} must "
                f"share batch and spatial size; use an upsampler whose output is input x scale"
            )
        return self.psi(self.relu(self.W_g(gate) + self.W_x(skip)))

    def forward(self, gate: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return skip * self.coefficients(gate, skip)
