"""CARAFE, FADE and SAPA in 3D: equal (outputs and gradients, float64) to a slow reference written
here from the equations, one output voxel at a time; anisotropic scales; the 3D U-Net takes them;
the reassembly equals an unfold written here at kernels 3 and 5; 2D is unchanged."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from upzoo import UNet, create_upsampler
from upzoo.upsamplers.reassembly import reassemble

SCALES = [(1, 2, 2), pytest.param((2, 2, 2), marks=pytest.mark.slow), pytest.param((2, 1, 3), marks=pytest.mark.slow)]


def _neighbours(k: int):
    r = k // 2
    return list(itertools.product(range(-r, r + 1), repeat=3))  # row-major, the blocks' kernel order


def _at(t: torch.Tensor, point) -> torch.Tensor:
    """``t[:, :, z, y, x]`` or zeros outside (the zero padding of the equations)."""
    if all(0 <= p < s for p, s in zip(point, t.shape[2:])):
        return t[:, :, point[0], point[1], point[2]]
    return torch.zeros_like(t[:, :, 0, 0, 0])


def _reference(x: torch.Tensor, scale, k: int, kernel_logits) -> torch.Tensor:
    """``y[o] = sum_d softmax_d(logits(o, d)) * x[o // s + d]`` for every output voxel ``o``."""
    b, c, *size = x.shape
    out = torch.zeros(b, c, *(n * s for n, s in zip(size, scale)), dtype=x.dtype)
    for o in itertools.product(*(range(n * s) for n, s in zip(size, scale))):
        p = [i // s for i, s in zip(o, scale)]
        sub = 0
        for i, s in zip(o, scale):
            sub = sub * s + i % s  # row-major sub-position
        offsets = _neighbours(k)
        weights = torch.stack([kernel_logits(o, p, sub, i, d) for i, d in enumerate(offsets)], dim=1).softmax(dim=1)
        values = torch.stack([_at(x, [a + e for a, e in zip(p, d)]) for d in offsets], dim=2)  # (B, C, k³)
        out[(slice(None), slice(None), *o)] = (values * weights[:, None]).sum(dim=2)
    return out


def _carafe_reference(block, x):
    logits = block.encoder(block.compress(x))  # (B, k³ * r, *S): kernel entry d of sub-position sub
    r = block.scale_product
    return _reference(
        x, block.scale, block.kernel_size, lambda o, p, sub, i, d: logits[:, i * r + sub, p[0], p[1], p[2]]
    )


def _fade_reference(block, x, guide):
    decoder = block.content(block.compress_x(x))  # (B, k³, *S) at the source voxel
    encoder = block.content(block.compress_guide(guide))  # (B, k³, *S * scale) at the output voxel
    y = _reference(
        x, block.scale, block.kernel_size,
        lambda o, p, sub, i, d: encoder[:, i, o[0], o[1], o[2]] + decoder[:, i, p[0], p[1], p[2]],
    )  # fmt: skip
    gate = torch.sigmoid(F.interpolate(block.gate(x), scale_factor=block.scale, mode="nearest"))
    detail = block.align(guide) if block.align is not None else guide
    return gate * detail + (1 - gate) * y


def _sapa_reference(block, x, guide):
    q = block.query(block.norm_guide(guide.movedim(1, -1))).movedim(-1, 1)  # (B, D, *S * scale)
    keys = block.key(block.norm_x(x.movedim(1, -1))).movedim(-1, 1)  # (B, D, *S)

    def similarity(o, p, sub, i, d):
        key = _at(keys, [a + e for a, e in zip(p, d)])  # zero outside: border "zeros"
        return (q[:, :, o[0], o[1], o[2]] * key).sum(dim=1)

    return _reference(x, block.scale, block.kernel_size, similarity)


REFERENCES = {"carafe": _carafe_reference, "fade": _fade_reference, "sapa": _sapa_reference}


@pytest.mark.parametrize("scale", SCALES, ids=["1x2x2", "2x2x2", "2x1x3"])
@pytest.mark.parametrize("name", REFERENCES)
def test_3d_block_equals_the_equations_in_float64(name, scale):
    torch.manual_seed(0)
    guided = name != "carafe"
    options = {"guide_channels": 3} if guided else {"embedding_channels": 4}
    if name == "carafe":
        options["encoder_kernel_size"] = 3
    block = create_upsampler(name, spatial_dims=3, in_channels=2, out_channels=2, scale=scale, **options).double()
    if name == "carafe":  # the fresh block's N(0, 0.001) encoder gives near-uniform kernels: make them differ
        torch.nn.init.normal_(block.encoder.weight, std=0.5)
    assert block.kernel_size == 3  # the 3D default
    x = torch.randn(2, 2, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    args = [x]
    if guided:
        args.append(torch.randn(2, 3, *(n * s for n, s in zip(x.shape[2:], scale)), dtype=torch.float64))
    got, expected = block(*args), REFERENCES[name](block, *args)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    weights = torch.randn_like(got)
    (grad_got,) = torch.autograd.grad((got * weights).sum(), x)
    (grad_expected,) = torch.autograd.grad((expected * weights).sum(), x)
    torch.testing.assert_close(grad_got, grad_expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("k", [3, 5])
def test_3d_reassembly_equals_the_equations_at_kernels_3_and_5(k):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 2, 3, 4, dtype=torch.float64)
    scale = (1, 2, 2)
    logits = torch.randn(2, k**3, 4, 2, 3, 4, dtype=torch.float64)  # (B, k³, r, *S)
    expected = _reference(x, scale, k, lambda o, p, sub, i, d: logits[:, i, sub, p[0], p[1], p[2]])
    torch.testing.assert_close(reassemble(x, logits.softmax(dim=1), k, scale), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "name", [pytest.param("carafe", marks=pytest.mark.slow), "fade", pytest.param("sapa", marks=pytest.mark.slow)]
)
def test_the_3d_unet_takes_them_with_anisotropic_strides(name):
    net = UNet(
        spatial_dims=3, in_channels=1, num_classes=3, encoder_depth=3, channels=[4, 8, 16],
        strides=[[1, 2, 2], [2, 2, 2]], upsampler=name,
    )  # fmt: skip
    x = torch.randn(2, 1, 6, 20, 18)
    out = net(x)
    assert out.shape == (2, 3, 6, 20, 18)
    (out * torch.randn_like(out)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
