"""Fourier upsampling (``mode: fourier`` of ``interpolate`` and ``interp_conv``): equal to
scipy.signal.resample per axis, 2D and 3D, odd and even sizes, per-axis scales; gradients; compiled,
exported with dynamic sizes and converted to ONNX with the same values; bad options in one line."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.signal import resample
from torch.export import Dim

from upzoo import create_upsampler
from upzoo.errors import ConfigError
from upzoo.upsamplers.fourier import fourier_resample


@pytest.mark.parametrize(
    ("shape", "scale"),
    [((2, 3, 7, 10), (2, 3)), ((1, 2, 8, 8), (4, 4)), ((1, 1, 5, 6, 9), (1, 2, 2)), ((2, 2, 4, 3, 6), (3, 1, 2))],
)
def test_equals_scipys_resample_axis_by_axis(shape, scale):
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = x.numpy()
    for axis, factor in enumerate(scale, start=2):
        expected = resample(expected, expected.shape[axis] * factor, axis=axis)
    np.testing.assert_allclose(fourier_resample(x, scale).numpy(), expected, rtol=0, atol=1e-12)
    got32 = fourier_resample(x.float(), scale).double().numpy()
    np.testing.assert_allclose(got32, expected, rtol=1e-5, atol=2e-5)  # float32: FFT round-off only


def test_band_limited_signals_come_back_exactly_and_samples_are_kept():
    n, k = 12, 3
    t = torch.arange(n * k, dtype=torch.float64) / (n * k)
    signal = torch.cos(2 * torch.pi * 2 * t) + 0.5 * torch.sin(2 * torch.pi * 5 * t)  # below n / 2 cycles
    low = signal[::k].reshape(1, 1, n)
    torch.testing.assert_close(fourier_resample(low, (k,))[0, 0], signal)
    x = torch.randn(1, 2, 9, 8, dtype=torch.float64)
    up = fourier_resample(x, (2, 2))
    torch.testing.assert_close(up[..., ::2, ::2], x)  # the input samples, unchanged


@pytest.mark.parametrize("name", ["interpolate", "interp_conv"])
@pytest.mark.parametrize("spatial_dims", [2, 3])
def test_the_blocks_take_mode_fourier(name, spatial_dims):
    scale = (2, 3) if spatial_dims == 2 else (1, 2, 2)
    out_channels = 4 if name == "interpolate" else 5
    block = create_upsampler(name, spatial_dims=spatial_dims, in_channels=4, out_channels=out_channels,
                             scale=scale, mode="fourier").double()  # fmt: skip
    size = (5, 6, 7)[:spatial_dims]
    x = torch.randn(2, 4, *size, dtype=torch.float64, requires_grad=True)
    y = block(x)
    assert tuple(y.shape) == block.output_shape(tuple(x.shape))
    if name == "interpolate":
        torch.testing.assert_close(y, fourier_resample(x, scale))
    small = x[:1, :, :3, :4] if spatial_dims == 2 else x[:1, :, :2, :3, :3]
    assert torch.autograd.gradcheck(block, (small.detach().requires_grad_(),))
    assert fourier_resample(x.detach().bfloat16(), scale).dtype == torch.bfloat16  # computed in float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert block.float()(x.detach().float()).shape == y.shape


@pytest.mark.slow  # 7-14 s: a compile, an export and an ONNX conversion
def test_fourier_compiles_exports_and_converts_to_onnx(tmp_path):
    import onnxruntime as ort

    block = create_upsampler("interp_conv", spatial_dims=2, in_channels=3, out_channels=4, scale=2, mode="fourier")
    example = torch.randn(2, 3, 8, 10)
    dynamic = ({0: Dim.DYNAMIC, 2: Dim.DYNAMIC, 3: Dim.DYNAMIC},)
    compiled = torch.compile(block, fullgraph=True, dynamic=True, backend="aot_eager")
    program = torch.export.export(block, (example,), dynamic_shapes=dynamic).module()
    path = tmp_path / "fourier.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(block, (example,), str(path), input_names=["x"], dynamic_shapes=dynamic, dynamo=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in [(2, 3, 8, 10), (1, 3, 7, 9), (3, 3, 6, 5)]:
        x = torch.randn(shape)
        with torch.no_grad():
            expected = block(x)
            torch.testing.assert_close(compiled(x), expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(program(x), expected)
        (got,) = session.run(None, {"x": x.numpy()})
        assert np.abs(got - expected.numpy()).max() <= 1e-4


def test_bad_fourier_options_are_one_line():
    with pytest.raises(
        ConfigError, match="align_corners applies to bilinear/bicubic/trilinear only, not mode='fourier'"
    ):
        create_upsampler("interpolate", spatial_dims=2, in_channels=2, out_channels=2, scale=2, mode="fourier",
                         align_corners=True)  # fmt: skip
    with pytest.raises(ConfigError, match="scale"):
        create_upsampler("interpolate", spatial_dims=2, in_channels=2, out_channels=2, scale=1.5, mode="fourier")
    with pytest.raises(ConfigError, match="interpolate.mode: expected one of .*'fourier', got 'fft'"):
        create_upsampler("interpolate", spatial_dims=2, in_channels=2, out_channels=2, scale=2, mode="fft")
