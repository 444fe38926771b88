"""Attention gates on the U-Net's skips (Oktay et al. 2018): equal to MONAI's ``AttentionBlock`` on the
same weights, in 2D and 3D, in training and eval mode; ``UNet(attention_gates=True)`` after any block,
its gates trained; bad input in one line."""

from __future__ import annotations

import pytest
import torch

from upzoo import UNet
from upzoo.errors import ConfigError, ShapeError
from upzoo.models.attention_gate import AttentionGate


@pytest.mark.parametrize("spatial_dims", [2, 3])
def test_the_gate_equals_monais_attention_block_on_the_same_weights(spatial_dims):
    from monai.networks.nets.attentionunet import AttentionBlock

    torch.manual_seed(0)
    reference = AttentionBlock(spatial_dims, f_int=3, f_g=8, f_l=6)
    gate = AttentionGate(spatial_dims, gate_channels=8, skip_channels=6)
    state = {key.replace(".0.conv.", ".0."): value for key, value in reference.state_dict().items()}
    gate.load_state_dict(state, strict=True)  # every tensor used once
    size = (5, 6, 7)[:spatial_dims]
    g = torch.randn(2, 8, *size, requires_grad=True)
    x = torch.randn(2, 6, *size, requires_grad=True)
    for train in (True, False):
        reference.train(train), gate.train(train)
        expected, got = reference(g, x), gate(g, x)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        grads = torch.autograd.grad(expected.square().sum(), (g, x))
        torch.testing.assert_close(torch.autograd.grad(got.square().sum(), (g, x)), grads, rtol=1e-5, atol=1e-6)
    alpha = gate.coefficients(g, x)
    assert alpha.shape == (2, 1, *size) and 0 < float(alpha.min()) and float(alpha.max()) < 1


@pytest.mark.parametrize(
    ("spatial_dims", "upsampler", "strides"),
    [(2, "transposed", None), (2, "dysample", None), (3, "pixel_shuffle", [(1, 2, 2), (2, 2, 2)]),
     (3, "interp_conv", [(1, 2, 2), (2, 2, 2)])],
)  # fmt: skip
def test_a_unet_gates_every_skip_after_any_block(spatial_dims, upsampler, strides):
    torch.manual_seed(0)
    options = dict(spatial_dims=spatial_dims, in_channels=2, num_classes=3, channels=(4, 8, 16), strides=strides,
                   upsampler=upsampler)  # fmt: skip
    net = UNet(**options, attention_gates=True)
    plain = UNet(**options)
    gates = [stage.attention for stage in net.decoder]
    assert all(isinstance(g, AttentionGate) for g in gates) and all(s.attention is None for s in plain.decoder)
    size = (6, 20, 18)[-spatial_dims:]
    x = torch.randn(2, 2, *size)
    out = net(x)
    assert out.shape == plain(x).shape == (2, 3, *size)
    out.square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for g in gates for p in g.parameters())


def test_gates_refuse_what_does_not_fit():
    with pytest.raises(ConfigError, match="attention_gates must be True or False"):
        UNet(spatial_dims=2, in_channels=1, num_classes=2, channels=(4, 8), attention_gates="yes")
    gate = AttentionGate(2, gate_channels=4, skip_channels=4)
    with pytest.raises(ShapeError, match=r"the upsampled features \(1, 4, 8, 8\) and the skip \(1, 4, 8, 9\) must"):
        gate(torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 9))
