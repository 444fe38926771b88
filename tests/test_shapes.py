"""Shape rules against PyTorch's real layers (hypothesis), the solver against real forward passes."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn

from upzoo import UNet
from upzoo.errors import ConfigError, ShapeError
from upzoo.models import smp_unet
from upzoo.shapes import ShapeSolver, layer_output_shape, solve_transposed, trace
from upzoo.shapes.rules import conv_transpose_output_size
from upzoo.upsamplers import CheckerboardWarning

CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
CONV_T = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
MAXPOOL = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}
AVGPOOL = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}


def _real_shape(layer: nn.Module, shape: tuple[int, ...]):
    """PyTorch's output shape, or None where it fails. Some backends return an empty tensor instead of
    failing when a transposed conv's output size is 0; an empty output counts as a failure too."""
    try:
        with torch.no_grad():
            out = tuple(layer(torch.zeros(shape)).shape)
    except RuntimeError:
        return None
    return out if all(s > 0 for s in out[2:]) else None


def _rule_shape(layer: nn.Module, shape: tuple[int, ...]):
    try:
        return layer_output_shape(layer, shape)
    except ShapeError:
        return None


layer_settings = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@layer_settings
@given(dims=st.integers(1, 3), data=st.data())
def test_conv_rule_equals_pytorch(dims, data):
    k = data.draw(st.integers(1, 5))
    d = data.draw(st.integers(1, 3))
    layer = CONV[dims](1, 2, k, stride=data.draw(st.integers(1, 4)), padding=data.draw(st.integers(0, 3)), dilation=d)
    shape = (1, 1, *data.draw(st.lists(st.integers(1, 13), min_size=dims, max_size=dims)))
    assert _rule_shape(layer, shape) == _real_shape(layer, shape)


@layer_settings
@given(dims=st.integers(1, 3), data=st.data())
def test_conv_transpose_rule_equals_pytorch(dims, data):
    stride, dilation = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    layer = CONV_T[dims](
        1,
        1,
        data.draw(st.integers(1, 5)),
        stride=stride,
        padding=data.draw(st.integers(0, 3)),
        output_padding=data.draw(st.integers(0, max(stride, dilation) - 1)),
        dilation=dilation,
    )
    shape = (1, 1, *data.draw(st.lists(st.integers(1, 9), min_size=dims, max_size=dims)))
    assert _rule_shape(layer, shape) == _real_shape(layer, shape)


@layer_settings
@given(dims=st.integers(1, 3), data=st.data())
def test_pool_rules_equal_pytorch_including_ceil_mode(dims, data):
    k = data.draw(st.integers(1, 4))
    stride = data.draw(st.integers(1, 4))
    padding = data.draw(st.integers(0, k // 2))
    ceil = data.draw(st.booleans())
    if data.draw(st.booleans()):
        layer = MAXPOOL[dims](k, stride, padding, dilation=data.draw(st.integers(1, 2)), ceil_mode=ceil)
    else:
        layer = AVGPOOL[dims](k, stride, padding, ceil_mode=ceil)
    shape = (1, 1, *data.draw(st.lists(st.integers(1, 13), min_size=dims, max_size=dims)))
    assert _rule_shape(layer, shape) == _real_shape(layer, shape)


@pytest.mark.parametrize(
    "layer, shape",
    [
        (nn.Upsample(scale_factor=1.5), (1, 1, 7, 9)),
        (nn.Upsample(size=(5, 11)), (1, 1, 7, 9)),
        (nn.Upsample(scale_factor=(2, 1, 3), mode="trilinear"), (1, 2, 3, 4, 5)),
        (nn.PixelShuffle(3), (2, 18, 4, 5)),
        (nn.PixelUnshuffle(2), (2, 3, 8, 6)),
        (nn.AdaptiveAvgPool2d((3, None)), (1, 2, 9, 7)),
        (nn.Conv2d(2, 3, 3, padding="same", dilation=2), (1, 2, 9, 8)),
    ],
)
def test_resize_and_shuffle_rules_equal_pytorch(layer, shape):
    assert layer_output_shape(layer, shape) == _real_shape(layer, shape)


def test_trace_lists_layers_on_the_meta_device_without_touching_weights():
    net = UNet(
        spatial_dims=3, in_channels=1, num_classes=2, channels=(4, 8), strides=[(1, 2, 2)], upsampler="pixel_shuffle"
    )
    before = {k: v.clone() for k, v in net.state_dict().items()}
    rows = trace(net, (2, 1, 5, 12, 10))
    assert rows[-1].name == "head" and rows[-1].output_shape == (2, 2, 5, 12, 10)
    up = next(r for r in rows if r.layer == "PixelShuffleUpsampler")
    assert up.input_shape == (2, 8, 5, 6, 5) and up.output_shape == (2, 8, 5, 12, 10)
    assert up.params == sum(p.numel() for p in net.decoder[0].upsample.parameters())
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert next(net.parameters()).device.type == "cpu"
    with pytest.raises(ShapeError, match="expects 1 input channels"):
        trace(net, (1, 3, 5, 12, 10))


# -- the solver against real forward passes ----------------------------------------------------------
def _native(net: UNet) -> UNet:
    """Switch off the U-Net's own padding so that invalid sizes fail for real inside PyTorch."""
    net.padded_size = lambda spatial: tuple(spatial)
    return net.eval()


def _runs_natively(net: nn.Module, size: tuple[int, ...], channels: int | None = None) -> bool:
    try:
        with torch.no_grad():
            out = net(torch.zeros(1, channels or net.in_channels, *size))
    except (RuntimeError, ShapeError):
        return False
    return tuple(out.shape[2:]) == size


UPSAMPLING = st.sampled_from(
    [
        ("transposed", {}),
        ("interp_conv", {}),
        ("pixel_shuffle", {}),
        ("transposed", {"kernel_size": 3, "padding": 1, "output_padding": 1}),
        ("transposed", {"kernel_size": 3, "padding": 1}),  # 2n - 1: never matches the skip
    ]
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strides=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=3), up=UPSAMPLING)
def test_solver_verdicts_match_real_forward_passes_2d(strides, up):
    name, options = up
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckerboardWarning)
        try:
            net = _native(
                UNet(
                    spatial_dims=2,
                    in_channels=1,
                    num_classes=1,
                    channels=[2] * (len(strides) + 1),
                    strides=strides,
                    upsampler=name,
                    upsampler_options=options,
                    norm="none",
                )
            )
        except ConfigError:  # output_padding=1 at stride 1 is not a transposed conv PyTorch builds
            assume(False)
    solver = ShapeSolver(net)
    assert solver.path == "analytic"
    for size in [(5, 7), (6, 9), (12, 8), (18, 27), (36, 16)]:
        assert solver.is_valid(size) == _runs_natively(net, size), (size, strides, up)


def test_model_solver_and_input_policies_agree_on_one_rule():
    """kernel 3, padding 1 at scale 2 makes 2n - 1: valid sizes are 1 + 4k, not multiples of 4."""
    options = {"kernel_size": 3, "padding": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckerboardWarning)
        common = dict(spatial_dims=2, in_channels=1, num_classes=1, channels=(2, 2, 2), upsampler="transposed")
        net = UNet(**common, norm="none", upsampler_options=options).eval()
        strict = UNet(**common, norm="none", upsampler_options=options, input_policy="strict").eval()
        with pytest.raises(
            ConfigError,
            match=r"runs at no size in 1\.\.96 on axis 0: at input size 16 decoder "
            r"stage 0 \(TransposedConvUpsampler\) makes 9 where its skip has 8",
        ):
            UNet(**common, upsampler_options={"kernel_size": 3})
    solver = ShapeSolver(net)
    assert solver.rule(0).describe() == "1 + k*4 (k >= 0)" and net.size_rules[0] == solver.rule(0)
    native = _native(copy.deepcopy(net))
    for n in range(9, 22):
        assert solver.axis_valid(0, n) == _runs_natively(native, (n, n)), n
        with torch.no_grad():
            assert net(torch.zeros(1, 1, n, n + 3)).shape[2:] == (n, n + 3)  # the pad policy at every size
    assert strict(torch.zeros(1, 1, 17, 21)).shape[2:] == (17, 21)
    with pytest.raises(ShapeError, match=r"axis 0: 16 -> 13 or 17; axis 1: 16 -> 13 or 17"):
        strict(torch.zeros(1, 1, 16, 16))


def test_anisotropic_3d_rules_and_real_runs():
    net = _native(
        UNet(
            spatial_dims=3,
            in_channels=1,
            num_classes=1,
            channels=(2, 2, 2),
            strides=[(1, 2, 2), (2, 1, 2)],
            norm="none",
        )
    )
    solver = ShapeSolver(net)
    assert [solver.rule(a).describe() for a in range(3)] == ["multiples of 2", "multiples of 2", "multiples of 4"]
    for size in [(3, 6, 8), (4, 6, 8), (4, 5, 8), (6, 10, 12), (2, 2, 6)]:
        assert solver.is_valid(size) == _runs_natively(net, size), size
    checks = solver.check((37, 131, 97))
    assert [(c.below, c.above, c.padding) for c in checks] == [(36, 38, 1), (130, 132, 1), (96, 100, 3)]


def test_smp_models_are_analysed_and_agree_with_smp():
    net = smp_unet("resnet18", upsampler="pixel_shuffle", num_classes=2).eval()
    solver = ShapeSolver(net)
    assert solver.path == "analytic" and solver.rule(0).describe() == "multiples of 32"
    assert solver.valid_sizes(1, 40, 130) == [64, 96, 128]
    assert _runs_natively(net, (64, 96), 3)
    # any other size is padded up to the rule (as upzoo's U-Net does) and cropped back
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        padded = net(F.pad(x, [0, 16]))[..., :80]
        torch.testing.assert_close(net(x), padded)


def test_probe_fallback_for_modules_without_rules():
    class Odd(nn.Module):
        in_channels = 1

        def forward(self, x):
            y = F.max_pool2d(x, 3)  # functional: no module rule
            return F.interpolate(y, scale_factor=3) + x

    solver = ShapeSolver(Odd(), spatial_dims=2, probe_size=(9, 9))
    assert solver.path == "probe" and "no stride analysis" in solver.reason
    assert solver.rule(0).describe() == "multiples of 3"
    assert solver.check((10, 9))[0].below == 9 and solver.check((10, 9))[0].above == 12


def test_check_validates_its_input():
    solver = ShapeSolver(UNet(spatial_dims=2, in_channels=3, num_classes=2))
    with pytest.raises(ShapeError, match="2 spatial axes, got a size with 3"):
        solver.check((8, 8, 8))


# -- transposed-conv solver --------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), stride=st.integers(1, 4), scale=st.integers(1, 4))
def test_transposed_solutions_are_exact_and_flag_uneven_overlap(n, stride, scale):
    for s in solve_transposed(n, scale=scale, stride=stride, max_kernel=6):
        out = conv_transpose_output_size(
            n,
            kernel_size=s.kernel_size,
            stride=stride,
            padding=s.padding,
            output_padding=s.output_padding,
            dilation=s.dilation,
        )
        assert out == n * scale
        if s.dilation == 1:
            assert s.uneven_overlap == (s.kernel_size % stride != 0)
        layer = nn.ConvTranspose1d(1, 1, s.kernel_size, stride, s.padding, s.output_padding, dilation=s.dilation)
        assert layer(torch.zeros(1, 1, n)).shape[-1] == n * scale


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 30), target=st.integers(1, 90), stride=st.integers(1, 7), dilation=st.integers(1, 3))
def test_transposed_solver_finds_exactly_what_brute_force_finds(n, target, stride, dilation):
    from upzoo.upsamplers.transposed import overlap_counts

    expected = {
        (k, p, op, d, len(set(overlap_counts(k, stride, d))) > 1)
        for d in range(1, dilation + 1)
        for k in range(1, 9)
        for op in range(max(stride, d))
        for p in range(d * (k - 1) + 1)
        if conv_transpose_output_size(n, kernel_size=k, stride=stride, padding=p, output_padding=op, dilation=d)
        == target
    }
    found = solve_transposed(n, target, stride=stride, max_kernel=8, max_dilation=dilation)
    assert {(s.kernel_size, s.padding, s.output_padding, s.dilation, s.uneven_overlap) for s in found} == expected


def test_transposed_solver_cost_does_not_grow_with_the_stride():
    assert solve_transposed(33, 66, stride=99_999_999) == []  # was cubic in the stride: minutes
    assert len(solve_transposed(1, 66, stride=10_000_000, max_kernel=64)) > 0
    with pytest.raises(ConfigError, match="max_kernel and max_dilation go up to 256 and 16, got 100000000"):
        solve_transposed(33, 66, stride=2, max_kernel=100_000_000)


def test_transposed_solver_ranks_even_overlap_first():
    best = solve_transposed(33, 66, stride=2)
    assert (best[0].kernel_size, best[0].padding) == (2, 0)
    assert (best[1].kernel_size, best[1].padding) == (4, 1)  # the DCGAN stage
    assert any(s.kernel_size == 3 and s.uneven_overlap for s in best)
    with pytest.raises(ConfigError, match="exactly one of out_size and scale"):
        solve_transposed(33, 66, stride=2, scale=2)
