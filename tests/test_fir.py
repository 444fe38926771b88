"""The `fir` block (zero insertion + separable FIR low-pass, StyleGAN2's upsample2d) against
SciPy's ``upfirdn`` and a direct zero-insert-then-convolve formulation, in float64."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.signal
import torch
import torch.nn.functional as F

from upzoo import ConfigError, create_upsampler
from upzoo.upsamplers.fir import fir_padding, fir_upsample

CASES = [((2, 2), [1, 3, 3, 1]), ((3, 2), [1, 2, 3, 2, 1]), ((2, 3), [1, 1, 1, 1, 1, 1]), ((2, 2), [1, 1])]


def _scipy_reference(x: np.ndarray, taps: np.ndarray, scale) -> np.ndarray:
    """Along each upsampled axis: ``scipy.signal.upfirdn`` (zero insertion by ``s``, full
    convolution), gain ``s``, then the window StyleGAN2's padding selects: output ``t`` is full
    output ``t + n - 1 - before``, zero past its end."""
    h = taps / taps.sum()
    for axis, s in enumerate(scale):
        if s == 1:
            continue
        full = scipy.signal.upfirdn(h * s, x, up=s, axis=axis)
        before, _ = fir_padding(len(h), s)
        size = x.shape[axis] * s
        index = np.arange(size) + len(h) - 1 - before
        padded = np.concatenate([full, np.zeros_like(full.take([0] * len(h), axis=axis))], axis=axis)
        x = padded.take(index, axis=axis)
    return x


@pytest.mark.parametrize("scale, taps", CASES)
def test_fir_equals_scipy_upfirdn(scale, taps):
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 4))
    got = fir_upsample(torch.from_numpy(x), torch.tensor(taps, dtype=torch.float64) / sum(taps), scale)
    expected = _scipy_reference(x, np.asarray(taps, np.float64), (1, 1, *scale))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_fir_equals_zero_insertion_then_one_2d_convolution():
    """The definition in one step: zeros inserted on both axes at once, the padding, and one 2D
    convolution with the outer product of the taps (flipped: a convolution, not a correlation)."""
    taps = torch.tensor([1.0, 2.0, 4.0, 1.0], dtype=torch.float64)  # asymmetric: the flip matters
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    zeros = torch.zeros(2, 3, 8, 10, dtype=torch.float64)
    zeros[..., ::2, ::2] = x
    before, after = fir_padding(4, 2)
    kernel = torch.outer(taps, taps).flip(0, 1) / taps.sum() ** 2 * 4
    expected = F.conv2d(F.pad(zeros, [before, after] * 2), kernel.expand(3, 1, 4, 4), groups=3)
    got = create_upsampler("fir", spatial_dims=2, in_channels=3, out_channels=3, scale=2, taps=taps.tolist(),
                           kernel_size=None).double()(x)  # fmt: skip
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_fir_keeps_a_constant_and_leaves_axes_of_scale_one_unfiltered():
    block = create_upsampler("fir", spatial_dims=3, in_channels=2, out_channels=2, scale=(1, 2, 2), kernel_size=None)
    x = torch.rand(1, 2, 3, 1, 1).expand(1, 2, 3, 6, 6).contiguous()  # constant in-plane, varying across slices
    y = block(x)
    torch.testing.assert_close(y[..., 2:-2, 2:-2], x[..., :1, :1].expand(1, 2, 3, 8, 8))  # interior: the same constant
    assert y.shape == (1, 2, 3, 12, 12) == block.output_shape(x.shape)


def test_fir_with_a_convolution_is_filter_then_conv():
    block = create_upsampler("fir", spatial_dims=2, in_channels=3, out_channels=5, scale=2).double()
    x = torch.randn(1, 3, 6, 6, dtype=torch.float64)
    expected = block.conv(fir_upsample(x, block.taps.double(), (2, 2)))
    torch.testing.assert_close(block(x), expected)
    assert [name for name, _ in block.named_buffers()] == ["taps"] and "taps" not in block.state_dict()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"taps": []}, r"fir taps must be a non-empty list of finite numbers, e.g. \[1, 3, 3, 1\], got \[\]"),
        ({"taps": [1, float("nan"), 1]}, "fir taps must be a non-empty list of finite numbers"),
        ({"taps": [1, float("inf")]}, "fir taps must be a non-empty list of finite numbers"),
        ({"taps": "1331"}, "got '1331'"),
        ({"taps": [1, True]}, r"fir.taps: expected a list of number or null, got \[1, True\]"),
        (
            {"taps": [1, -2, 1]},
            r"fir taps must not sum to zero \(a low-pass filter keeps the mean\), got \[1.0, -2.0, 1.0\]",
        ),
        ({"taps": [1]}, r"1 taps cannot fill the 1 zeros inserted per sample at scale 2; give at least 2 taps"),
        ({"kernel_size": 4}, "fir kernel_size must be odd"),
        ({"kernel_size": 0}, "fir kernel_size must be a whole number >= 1, got 0"),
        ({"kernel_size": None, "out_channels": 4}, r"out_channels \(4\) must equal in_channels \(3\)"),
    ],
)
def test_bad_fir_options_are_one_line_config_errors(options, message):
    arguments = {"spatial_dims": 2, "in_channels": 3, "out_channels": 3, "scale": 2, **options}
    with pytest.raises(ConfigError, match=message) as info:
        create_upsampler("fir", **arguments)
    assert "\n" not in str(info.value)


def test_a_scale_the_taps_cannot_serve_is_refused():
    with pytest.raises(ConfigError, match="4 taps cannot fill the 4 zeros inserted per sample at scale 5"):
        create_upsampler("fir", spatial_dims=2, in_channels=3, out_channels=3, scale=(2, 5), taps=[1, 3, 3, 1])


@pytest.mark.slow
@pytest.mark.parametrize("taps", [[1, 3, 3, 1], [1, 2, 3, 2, 1]])  # n - s even, and odd (the last sample dropped)
def test_fir_exports_with_dynamic_sizes_to_torch_export_and_onnxruntime(taps, tmp_path):
    import onnxruntime as ort
    from torch.export import Dim

    block = create_upsampler("fir", spatial_dims=2, in_channels=3, out_channels=4, scale=(2, 3), taps=taps).eval()
    x, other = torch.randn(2, 3, 5, 6), torch.randn(3, 3, 7, 4)
    dynamic = ({0: Dim.DYNAMIC, 2: Dim.DYNAMIC, 3: Dim.DYNAMIC},)
    program = torch.export.export(block, (x,), dynamic_shapes=dynamic)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(other), block(other))
        path = tmp_path / "fir.onnx"
        torch.onnx.export(block, (x,), str(path), input_names=["x"], dynamic_shapes=dynamic, dynamo=True)
        (got,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": other.numpy()})
        np.testing.assert_allclose(got, block(other).numpy(), atol=1e-5)


@pytest.mark.parametrize("scale", [2, 3, 8, (1, 8)])
def test_the_default_taps_serve_any_scale_and_keep_a_constant(scale):
    """Decoders upsample by 8 at some points: the default taps grow with the scale ([1, 3, 3, 1] at 2)."""
    block = create_upsampler("fir", spatial_dims=2, in_channels=1, out_channels=1, scale=scale, kernel_size=None)
    y = block(torch.ones(1, 1, 6, 6))
    s = (scale, scale) if isinstance(scale, int) else scale
    assert y.shape == (1, 1, 6 * s[0], 6 * s[1]) and len(block.taps) == 3 * max(s) - 2
    interior = y[..., 2 * s[0] : -2 * s[0] or None, 2 * s[1] : -2 * s[1]]
    torch.testing.assert_close(interior, torch.ones_like(interior))
