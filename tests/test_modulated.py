"""StyleGAN2's modulated convolution and the ``modulated`` block against independent definitions:
lucidrains' ``Conv2DMod`` (stylegan2-pytorch 1.9.0, MIT), rosinality's ``ModulatedConv2d`` with
``upsample=True`` and its ``upfirdn2d_native`` (rosinality/stylegan2-pytorch, ``model.py`` and
``op/upfirdn2d.py``, MIT), and a per-sample loop; forward and gradients to 1e-5."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from upzoo.errors import ConfigError, ShapeError
from upzoo.registry import create_upsampler
from upzoo.upsamplers.modulated import ModulatedConv2d, ModulatedUpsampler


def _lucidrains_conv2dmod(x, y, weight, eps=1e-8):
    """``Conv2DMod.forward`` of stylegan2_pytorch/stylegan2_pytorch.py (1.9.0), re-typed: the style
    enters as ``y + 1``, the weight is used as stored."""
    b, c, h, w = x.shape
    weights = weight[None] * (y[:, None, :, None, None] + 1)
    weights = weights * torch.rsqrt((weights**2).sum(dim=(2, 3, 4), keepdim=True) + eps)
    x = x.reshape(1, -1, h, w)
    weights = weights.reshape(b * weight.shape[0], *weights.shape[2:])
    x = F.conv2d(x, weights, padding=weight.shape[-1] // 2, groups=b)
    return x.reshape(-1, weight.shape[0], h, w)


def _upfirdn2d_native(x, kernel, up_x, up_y, down_x, down_y, pad_x0, pad_x1, pad_y0, pad_y1):
    """rosinality's ``upfirdn2d_native`` (op/upfirdn2d.py), re-typed for the cases used here."""
    _, channel, in_h, in_w = x.shape
    x = x.reshape(-1, in_h, in_w, 1)
    _, in_h, in_w, minor = x.shape
    kernel_h, kernel_w = kernel.shape
    out = x.view(-1, in_h, 1, in_w, 1, minor)
    out = F.pad(out, [0, 0, 0, up_x - 1, 0, 0, 0, up_y - 1])
    out = out.view(-1, in_h * up_y, in_w * up_x, minor)
    out = F.pad(out, [0, 0, max(pad_x0, 0), max(pad_x1, 0), max(pad_y0, 0), max(pad_y1, 0)])
    out = out.permute(0, 3, 1, 2)
    out = out.reshape([-1, 1, in_h * up_y + pad_y0 + pad_y1, in_w * up_x + pad_x0 + pad_x1])
    w = torch.flip(kernel, [0, 1]).view(1, 1, kernel_h, kernel_w)
    out = F.conv2d(out, w)
    out = out.reshape(
        -1, minor, in_h * up_y + pad_y0 + pad_y1 - kernel_h + 1, in_w * up_x + pad_x0 + pad_x1 - kernel_w + 1
    )
    out = out.permute(0, 2, 3, 1)[:, ::down_y, ::down_x, :]
    return out.reshape(-1, channel, out.shape[1], out.shape[2])


def _rosinality_up(x, style, weight, affine_w, affine_b, style_dim):
    """rosinality's ``ModulatedConv2d(upsample=True)`` forward with ``Blur([1, 3, 3, 1], pad=(1, 1),
    upsample_factor=2)``, re-typed: ``EqualLinear`` (scale 1/sqrt(style_dim), bias 1) for the style,
    the weight scaled by 1/sqrt(fan_in), demodulated, transposed conv of stride 2, then the blur."""
    batch, in_channel, height, width = x.shape
    out_channel, _, k, _ = weight.shape
    s = F.linear(style, affine_w * (1 / style_dim**0.5), affine_b)
    w = (1 / (in_channel * k * k) ** 0.5) * weight[None] * s.view(batch, 1, in_channel, 1, 1)
    w = w * torch.rsqrt(w.pow(2).sum([2, 3, 4]) + 1e-8).view(batch, out_channel, 1, 1, 1)
    w = w.view(batch, out_channel, in_channel, k, k).transpose(1, 2).reshape(batch * in_channel, out_channel, k, k)
    out = F.conv_transpose2d(x.view(1, batch * in_channel, height, width), w, padding=0, stride=2, groups=batch)
    out = out.view(batch, out_channel, *out.shape[-2:])
    taps = torch.tensor([1.0, 3.0, 3.0, 1.0])
    kernel = torch.outer(taps, taps)
    kernel = kernel / kernel.sum() * 4
    return _upfirdn2d_native(out, kernel, 1, 1, 1, 1, 1, 1, 1, 1)


def _grads(outputs, inputs):
    return torch.autograd.grad(outputs, inputs, grad_outputs=torch.ones_like(outputs))


def test_the_modulated_conv_equals_lucidrains_conv2dmod_forward_and_gradients():
    torch.manual_seed(0)
    conv = ModulatedConv2d(6, 5, 3, style_dim=7)
    x = torch.randn(3, 6, 9, 8, requires_grad=True)
    style = torch.randn(3, 7, requires_grad=True)
    ours = conv(x, style)
    y = conv.styles(style) - 1  # lucidrains adds the 1 itself
    theirs = _lucidrains_conv2dmod(x, y, conv.weight * conv.weight_gain)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    for a, b in zip(_grads(ours, (x, style)), _grads(theirs, (x, style)), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_stylegan2_form_equals_rosinalitys_modulated_upsampling_and_its_gradients():
    torch.manual_seed(0)
    block = ModulatedUpsampler(spatial_dims=2, in_channels=6, out_channels=4, scale=2, style_dim=7)
    x = torch.randn(2, 6, 7, 5, requires_grad=True)
    style = torch.randn(2, 7, requires_grad=True)
    ours = block(x, style)
    conv = block.conv
    theirs = _rosinality_up(x, style, conv.weight, conv.affine_weight, conv.affine_bias, 7)
    assert ours.shape == theirs.shape == (2, 4, 14, 10)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    params = (x, style, conv.weight, conv.affine_weight)
    for a, b in zip(_grads(ours, params), _grads(theirs, params), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_transposed_form_equals_one_transposed_conv_per_sample():
    torch.manual_seed(0)
    block = ModulatedUpsampler(spatial_dims=2, in_channels=4, out_channels=3, scale=2, style_dim=5, form="transposed")
    x, style = torch.randn(3, 4, 6, 7), torch.randn(3, 5)
    conv = block.conv
    expected = []
    for i in range(3):
        w = conv.weight * conv.weight_gain * conv.styles(style[i : i + 1])[0].view(1, -1, 1, 1)
        w = w / torch.sqrt(w.pow(2).sum(dim=(1, 2, 3), keepdim=True) + 1e-8)
        expected.append(F.conv_transpose2d(x[i : i + 1], w.transpose(0, 1), stride=2, padding=1))
    torch.testing.assert_close(block(x, style), torch.cat(expected), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("block", "options"), [("interpolate", {"mode": "bilinear"}), ("fir", None),
                                                ("pixel_shuffle", None), ("dysample", None),
                                                ("interpolate", {"mode": "fourier"})])  # fmt: skip
def test_the_after_form_is_the_block_then_the_modulated_conv(block, options):
    torch.manual_seed(0)
    up = ModulatedUpsampler(spatial_dims=2, in_channels=4, out_channels=3, scale=2, style_dim=5, form="after",
                            block=block, block_options=options)  # fmt: skip
    x, style = torch.randn(2, 4, 6, 8), torch.randn(2, 5)
    torch.testing.assert_close(up(x, style), up.conv(up.resize(x), style))
    assert type(up.resize).__name__ != "ModulatedUpsampler" and up(x, style).shape == (2, 3, 12, 16)


def test_a_constant_style_is_the_unmodulated_conv_demodulated():
    """With the affine's weight zero the style is 1 everywhere: every sample gets the same weights."""
    conv = ModulatedConv2d(4, 3, 3, style_dim=2)
    with torch.no_grad():
        conv.affine_weight.zero_()
    x = torch.randn(2, 4, 5, 5)
    w = conv.weight * conv.weight_gain
    w = w / torch.sqrt(w.pow(2).sum(dim=(1, 2, 3), keepdim=True) + 1e-8)
    torch.testing.assert_close(conv(x, torch.randn(2, 2)), F.conv2d(x, w, padding=1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda b: b(torch.randn(2, 4, 5, 5)), ShapeError, r"style-conditioned: call it as block\(x, style\) with "
         r"style of shape \(2, 5\)"),
        (lambda b: b(torch.randn(2, 4, 5, 5), torch.randn(2, 6)), ShapeError, r"expects a style of shape \(2, 5\) "
         r"for a batch of 2, got \(2, 6\)"),
        (lambda b: b(torch.randn(2, 4, 5, 5), torch.randn(3, 5)), ShapeError, r"got \(3, 5\)"),
    ],
)  # fmt: skip
def test_a_missing_or_misshaped_style_is_one_line(call, error, message):
    block = ModulatedUpsampler(spatial_dims=2, in_channels=4, out_channels=3, scale=2, style_dim=5)
    with pytest.raises(error, match=message):
        call(block)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scale": 3}, r"form='stylegan2' upsamples by 2 \(its FIR alignment\), got scale 3"),
        ({"form": "magic"}, r"form must be one of stylegan2, transposed, after, got 'magic'"),
        ({"block": "fir"}, r"block and block_options belong to form='after', not form='stylegan2'"),
        ({"form": "transposed", "scale": (1, 2)}, r"form='transposed' upsamples both axes alike"),
        ({"form": "after", "block": "fade"}, r"block 'fade' is guided; give a block that upsamples alone"),
        ({"form": "after", "block": "modulated"}, r"block 'modulated' is style-conditioned"),
        ({"style_dim": 0}, r"modulated style_dim must be a whole number >= 1, got 0"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message):
    kwargs = {"spatial_dims": 2, "in_channels": 4, "out_channels": 3, "scale": 2, "style_dim": 5, **options}
    with pytest.raises(ConfigError, match=message):
        create_upsampler("modulated", **kwargs)


def test_the_registry_asks_for_the_style_width():
    with pytest.raises(ConfigError, match=r"upsampler 'modulated' is style-conditioned: give style_dim="):
        create_upsampler("modulated", spatial_dims=2, in_channels=4, out_channels=3, scale=2)
