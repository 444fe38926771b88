"""The depthwise-separable transposed convolution equals PyTorch's dense transposed convolution with
rank-one kernels (each channel pair: the depthwise kernel times the pointwise weight), 2D and 3D."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from upzoo.registry import create_upsampler


@pytest.mark.parametrize(
    ("dims", "scale", "options"),
    [(2, 2, {}), (2, 2, {"kernel_size": 4, "padding": 1}), (2, (1, 3), {}), (3, (1, 2, 2), {"kernel_size": (1, 4, 4),
     "padding": (0, 1, 1)})],
)  # fmt: skip
def test_it_equals_a_dense_transposed_conv_with_rank_one_kernels(dims, scale, options):
    torch.manual_seed(0)
    block = create_upsampler("separable_transposed", spatial_dims=dims, in_channels=5, out_channels=3, scale=scale,
                             **options)  # fmt: skip
    depthwise, pointwise = block.conv
    pw = pointwise.weight.reshape(3, 5)  # (out, in)
    dense = depthwise.weight * pw.t().reshape(5, 3, *([1] * dims))  # (in, out, *k): conv_transpose's layout
    bias = pw @ depthwise.bias + pointwise.bias
    x = torch.randn(2, 5, *([6] * dims))
    transpose = F.conv_transpose2d if dims == 2 else F.conv_transpose3d
    expected = transpose(x, dense, bias, stride=block.scale, padding=block.padding)
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)
    assert block.output_shape(x.shape) == tuple(expected.shape)


def test_it_holds_the_separable_count_of_weights():
    block = create_upsampler("separable_transposed", spatial_dims=2, in_channels=64, out_channels=32, scale=2,
                             kernel_size=4, padding=1)  # fmt: skip
    dense = create_upsampler("transposed", spatial_dims=2, in_channels=64, out_channels=32, scale=2, kernel_size=4,
                             padding=1)  # fmt: skip
    assert sum(p.numel() for p in block.parameters()) == 64 * 16 + 64 + 64 * 32 + 32
    assert sum(p.numel() for p in dense.parameters()) == 64 * 32 * 16 + 32
