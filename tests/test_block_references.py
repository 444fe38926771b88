"""Each block against an independent reference built from PyTorch's own layers or written out here."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from upzoo import ConfigError, ShapeError, UNet, create_upsampler
from upzoo.upsamplers import CheckerboardWarning, pixel_shuffle_nd, transposed_output_size


# -- transposed --------------------------------------------------------------------------------------
def test_transposed_equals_nn_conv_transpose_with_the_same_weights():
    block = create_upsampler("transposed", spatial_dims=3, in_channels=4, out_channels=3, scale=(1, 2, 2))
    ref = nn.ConvTranspose3d(4, 3, kernel_size=(1, 2, 2), stride=(1, 2, 2))
    ref.load_state_dict(block.conv.state_dict())
    x = torch.randn(2, 4, 3, 5, 7)
    torch.testing.assert_close(block(x), ref(x))
    assert block(x).shape == (2, 3, 3, 10, 14)


@pytest.mark.parametrize(
    "kernel, stride, padding, output_padding, dilation",
    [
        (k, s, p, op, d)
        for k, s, p, op, d in itertools.product([1, 2, 3, 4, 5], [1, 2, 3], [0, 1, 2], [0, 1], [1, 2])
        if op < max(s, d)
    ],
)
def test_transposed_output_formula_matches_pytorch(kernel, stride, padding, output_padding, dilation):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckerboardWarning)
        block = create_upsampler(
            "transposed",
            spatial_dims=2,
            in_channels=1,
            out_channels=1,
            scale=stride,
            kernel_size=kernel,
            padding=padding,
            output_padding=output_padding,
            dilation=dilation,
        )
    for size in (1, 4, 7):
        expected = transposed_output_size(
            size, kernel_size=kernel, stride=stride, padding=padding, output_padding=output_padding, dilation=dilation
        )
        if expected < 1:
            with pytest.raises(ShapeError, match="would produce spatial size"):
                block.output_shape((1, 1, size, size))
            continue
        y = block(torch.randn(1, 1, size, size))
        assert tuple(y.shape) == block.output_shape((1, 1, size, size)) == (1, 1, expected, expected)


def test_transposed_uneven_overlap_warns_and_dcgan_preset_does_not():
    with pytest.warns(
        CheckerboardWarning,
        match=r"^transposed: kernel_size=\(3, 3\) at stride \(2, 2\) overlaps "
        r"unevenly on axes \[0, 1\]",
    ) as caught:
        create_upsampler(
            "transposed",
            spatial_dims=2,
            in_channels=2,
            out_channels=2,
            scale=2,
            kernel_size=3,
            padding=1,
            output_padding=1,
        )
    assert caught[0].filename == __file__  # the warning points at the user's call, not at upzoo's internals
    with pytest.warns(
        CheckerboardWarning, match=r"^UNet decoder stage 1 \(upsampler_options\): transposed: "
    ) as caught:
        UNet(
            spatial_dims=2,
            in_channels=1,
            num_classes=1,
            channels=(2, 2, 2),
            upsampler=["transposed", "transposed"],
            upsampler_options=[None, {"kernel_size": 3, "padding": 1, "output_padding": 1}],
        )
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckerboardWarning)
        dcgan = create_upsampler(
            "transposed", spatial_dims=2, in_channels=2, out_channels=2, scale=2, kernel_size=4, padding=1
        )
    assert dcgan(torch.randn(1, 2, 33, 17)).shape == (1, 2, 66, 34)


def test_transposed_rejects_output_padding_not_below_stride():
    with pytest.raises(ConfigError, match="output_padding must be smaller than max"):
        create_upsampler("transposed", spatial_dims=2, in_channels=2, out_channels=2, scale=2, output_padding=2)


# -- pixel shuffle -----------------------------------------------------------------------------------
@pytest.mark.parametrize("r", [1, 2, 3])
def test_pixel_shuffle_nd_equals_torch_pixel_shuffle_in_2d(r):
    x = torch.randn(2, 3 * r * r, 4, 5)
    torch.testing.assert_close(pixel_shuffle_nd(x, (r, r)), F.pixel_shuffle(x, r))


def test_pixel_shuffle_nd_places_sub_positions_row_major_in_3d():
    scale = (1, 2, 3)
    x = torch.randn(1, 2 * 6, 2, 3, 4)
    y = pixel_shuffle_nd(x, scale)
    for c, d, h, w in itertools.product(range(2), range(2), range(6), range(12)):
        sub = (d % 1) * 6 + (h % 2) * 3 + (w % 3)
        assert y[0, c, d, h, w] == x[0, c * 6 + sub, d // 1, h // 2, w // 3]


@pytest.mark.parametrize("dims, scale", [(2, 2), (2, (1, 3)), (3, (1, 2, 2))])
def test_icnr_initialised_pixel_shuffle_is_nearest_upsampling_of_a_conv(dims, scale):
    block = create_upsampler("pixel_shuffle", spatial_dims=dims, in_channels=3, out_channels=2, scale=scale)
    scale_t = block.scale
    conv = (nn.Conv2d if dims == 2 else nn.Conv3d)(3, 2, 3, padding=1)
    with torch.no_grad():  # the kernel of sub-position 0 of each output channel
        conv.weight.copy_(block.conv.weight[:: block.scale_product])
        conv.bias.copy_(block.conv.bias[:: block.scale_product])
    x = torch.randn(2, 3, *([4] * dims))
    expected = F.interpolate(conv(x), scale_factor=scale_t, mode="nearest")
    torch.testing.assert_close(block(x), expected)


def test_pixel_shuffle_without_icnr_uses_pytorch_default_init_and_blur_keeps_shape():
    plain = create_upsampler("pixel_shuffle", spatial_dims=2, in_channels=3, out_channels=2, scale=2, icnr=False)
    w = plain.conv.weight
    assert not torch.equal(w[0], w[1])  # sub-kernels differ
    blurred = create_upsampler(
        "pixel_shuffle", spatial_dims=3, in_channels=3, out_channels=2, scale=(1, 2, 3), blur=True
    )
    assert blurred(torch.randn(1, 3, 2, 5, 5)).shape == (1, 2, 2, 10, 15)


# -- interpolation -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dims, mode, align",
    [
        (2, "nearest", None),
        (2, "bilinear", True),
        (2, "bicubic", False),
        (3, "trilinear", None),
        (3, "nearest-exact", None),
    ],
)
def test_interp_conv_equals_interpolate_then_conv(dims, mode, align):
    block = create_upsampler(
        "interp_conv", spatial_dims=dims, in_channels=3, out_channels=4, scale=2, mode=mode, align_corners=align
    )
    conv = (nn.Conv2d if dims == 2 else nn.Conv3d)(3, 4, 3, padding=1)
    conv.load_state_dict(block.conv.state_dict())
    x = torch.randn(2, 3, *([5] * dims))
    torch.testing.assert_close(block(x), conv(F.interpolate(x, scale_factor=2, mode=mode, align_corners=align)))
    plain = create_upsampler(
        "interpolate", spatial_dims=dims, in_channels=3, out_channels=3, scale=2, mode=mode, align_corners=align
    )
    torch.testing.assert_close(plain(x), F.interpolate(x, scale_factor=2, mode=mode, align_corners=align))


def test_interp_modes_are_checked_per_dims():
    with pytest.raises(
        ConfigError, match="mode for 3D must be one of nearest, nearest-exact, trilinear, fourier, got 'bilinear'"
    ):
        create_upsampler("interp_conv", spatial_dims=3, in_channels=2, out_channels=2, scale=2, mode="bilinear")
    with pytest.raises(ConfigError, match="align_corners applies to"):
        create_upsampler("interp_conv", spatial_dims=2, in_channels=2, out_channels=2, scale=2, align_corners=True)
    with pytest.raises(ConfigError, match="interp_conv kernel_size must be odd"):
        create_upsampler("interp_conv", spatial_dims=2, in_channels=2, out_channels=2, scale=2, kernel_size=2)


# -- DySample ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dims, scale, mode", [(2, 2, "bilinear"), (2, (2, 3), "bilinear"), (3, (1, 2, 2), "trilinear")]
)
def test_dysample_with_zero_offsets_is_linear_interpolation(dims, scale, mode):
    block = create_upsampler("dysample", spatial_dims=dims, in_channels=8, out_channels=8, scale=scale)
    nn.init.zeros_(block.offset.weight)
    x = torch.randn(2, 8, *([5] * dims))
    expected = F.interpolate(x, scale_factor=block.scale, mode=mode, align_corners=False)
    torch.testing.assert_close(block(x), expected, rtol=1e-5, atol=1e-5)


def test_dysample_offsets_move_samples_by_input_pixels():
    block = create_upsampler("dysample", spatial_dims=2, in_channels=1, out_channels=1, scale=2, groups=1)
    nn.init.zeros_(block.offset.weight)
    with torch.no_grad():  # channels: (axis, group, sub-position); shift every point +1 input pixel along W
        block.offset.bias.zero_()
        block.offset.bias[4:8] = 1.0 / 0.25
    x = torch.arange(8.0).repeat(8, 1)[None, None]  # value = column index
    y = block(x)
    expected = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False) + 1
    torch.testing.assert_close(y[..., 2:-4], expected[..., 2:-4])


def test_dysample_groups_must_divide_channels():
    with pytest.raises(ConfigError, match="positive divisor of in_channels=6"):
        create_upsampler("dysample", spatial_dims=2, in_channels=6, out_channels=6, scale=2, groups=4)
    assert create_upsampler("dysample", spatial_dims=2, in_channels=6, out_channels=6, scale=2).groups == 1


# -- CARAFE ------------------------------------------------------------------------------------------
def _carafe_loop(x, kernels, k, scale):
    """Reference: out[c, i, j] = sum_{a,b} K[i, j, a, b] * x_zero_padded[c, i // s + a - k//2, j // s + b - k//2]."""
    sh, sw = scale
    _, c, h, w = x.shape
    xp = F.pad(x, [k // 2] * 4)
    out = torch.zeros(1, c, h * sh, w * sw, dtype=x.dtype)
    for i in range(h * sh):
        for j in range(w * sw):
            window = xp[0, :, i // sh : i // sh + k, j // sw : j // sw + k]
            out[0, :, i, j] = (window * kernels[i, j]).sum(dim=(1, 2))
    return out


def test_carafe_equals_a_plain_loop_over_output_pixels():
    block = create_upsampler(
        "carafe", spatial_dims=2, in_channels=3, out_channels=3, scale=(2, 3), kernel_size=3, embedding_channels=4
    ).double()
    x = torch.randn(1, 3, 4, 5, dtype=torch.float64)
    logits = block.encoder(block.compress(x))  # (1, k*k * R, H, W), channel = kk * R + sub
    kernels = logits.reshape(1, 9, 6, 4, 5).softmax(dim=1)[0]  # (k*k, R, H, W)
    per_pixel = torch.zeros(8, 15, 3, 3, dtype=torch.float64)
    for i in range(8):
        for j in range(15):
            sub = (i % 2) * 3 + (j % 3)
            per_pixel[i, j] = kernels[:, sub, i // 2, j // 3].reshape(3, 3)
    torch.testing.assert_close(block(x), _carafe_loop(x, per_pixel, 3, (2, 3)))


def test_carafe_with_uniform_kernels_is_box_mean_then_nearest():
    block = create_upsampler("carafe", spatial_dims=2, in_channels=4, out_channels=4, scale=2, kernel_size=5)
    nn.init.zeros_(block.encoder.weight)
    nn.init.zeros_(block.encoder.bias)
    x = torch.randn(2, 4, 6, 7)
    box = F.avg_pool2d(x, 5, stride=1, padding=2, count_include_pad=True)
    torch.testing.assert_close(block(x), F.interpolate(box, scale_factor=2, mode="nearest"))
