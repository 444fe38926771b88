"""masked_gaussian_blur against a plain per-pixel loop, kornia and OpenCV; gradients; memory; errors."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import sysconfig

import cv2
import kornia
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck, gradgradcheck

import upzoo.filters.blur_fused as masked_blur_module  # the kernel and its switch live here
from upzoo import ConfigError, MaskedGaussianBlur, ShapeError, create_upsampler, masked_gaussian_blur
from upzoo.filters import gaussian_taps

NP_PAD = {"zeros": "constant", "reflect": "reflect", "replicate": "edge"}


def loop_reference(x: torch.Tensor, threshold: float, kernel_size: int, border: str, stride: int, sigma=None):
    """The original per-pixel loop, generalised to 2D/3D, every border mode and the stride grid."""
    a = x.detach().double().numpy()
    out = a.copy()
    p = kernel_size // 2
    taps = np.array(gaussian_taps(kernel_size, sigma))
    dims = a.ndim - 2
    kernel = taps
    for _ in range(dims - 1):
        kernel = np.multiply.outer(kernel, taps)
    if border == "valid":
        padded, offset = a, 0
        ranges = [range(p, n - p, stride) for n in a.shape[2:]]
    else:
        padded = np.pad(a, [(0, 0), (0, 0)] + [(p, p)] * dims, mode=NP_PAD[border])
        offset = p
        ranges = [[r for r in range(n) if (r - p) % stride == 0] for n in a.shape[2:]]
    for b, c in itertools.product(range(a.shape[0]), range(a.shape[1])):
        for pos in itertools.product(*ranges):
            if a[(b, c, *pos)] >= threshold:
                window = tuple(slice(q + offset - p, q + offset + p + 1) for q in pos)
                out[(b, c, *pos)] = (kernel * padded[(b, c, *window)]).sum()
    return torch.from_numpy(out).to(x.dtype)


class CountingKernel:
    """The fused kernel module, counting its calls (to tell which implementation ran)."""

    def __init__(self, kernel) -> None:
        self.kernel, self.calls = kernel, 0

    def forward(self, *args):
        self.calls += 1
        return self.kernel.forward(*args)

    def backward(self, *args):
        self.calls += 1
        return self.kernel.backward(*args)


@pytest.fixture(params=["fused", "pytorch"])
def implementation(request, monkeypatch):
    """Run the test with the fused CPU kernel (when built; the test must reach it) and with the
    PyTorch formulation."""
    if request.param == "pytorch":
        monkeypatch.setattr(masked_blur_module, "_cpu_kernel", None)
        yield request.param
        return
    if not masked_blur_module.FUSED_CPU_KERNEL:
        pytest.skip("the fused CPU kernel was not built at install (no C compiler, or its build failed)")
    counting = CountingKernel(masked_blur_module._cpu_kernel)
    monkeypatch.setattr(masked_blur_module, "_cpu_kernel", counting)
    yield request.param
    assert counting.calls > 0, "the test never reached the fused kernel"


@pytest.fixture
def counting_kernel(monkeypatch) -> CountingKernel:
    if not masked_blur_module.FUSED_CPU_KERNEL:
        pytest.skip("the fused CPU kernel was not built at install (no C compiler, or its build failed)")
    counting = CountingKernel(masked_blur_module._cpu_kernel)
    monkeypatch.setattr(masked_blur_module, "_cpu_kernel", counting)
    return counting


@pytest.mark.parametrize("border", ["valid", "zeros", "reflect", "replicate"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("threshold", [-10.0, 0.3, 10.0])
@pytest.mark.parametrize("kernel_size, sigma", [(3, None), (5, None), (5, 1.3)])
def test_2d_equals_the_per_pixel_loop(border, stride, threshold, kernel_size, sigma, implementation):
    x = torch.randn(2, 3, 9, 12, dtype=torch.float64)
    out = masked_gaussian_blur(
        x, threshold=threshold, kernel_size=kernel_size, sigma=sigma, border=border, stride=stride
    )
    torch.testing.assert_close(out, loop_reference(x, threshold, kernel_size, border, stride, sigma))
    assert out.shape == x.shape


@pytest.mark.parametrize("border", ["valid", "zeros", "reflect", "replicate"])
@pytest.mark.parametrize("stride", [1, 2])
def test_3d_equals_the_per_voxel_loop(border, stride, implementation):
    x = torch.randn(1, 2, 5, 6, 7, dtype=torch.float64)
    out = masked_gaussian_blur(x, threshold=0.0, border=border, stride=stride)
    torch.testing.assert_close(out, loop_reference(x, 0.0, 3, border, stride))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_non_finite_values_stay_where_they_are(dtype, implementation):
    x = torch.randn(2, 2, 8, 9, dtype=dtype)
    x[0, 0, 3, 3], x[0, 1, 5, 2], x[1, 0, 1, 6] = float("inf"), float("nan"), float("-inf")
    out = masked_gaussian_blur(x, threshold=0.3)
    torch.testing.assert_close(out, loop_reference(x, 0.3, 3, "valid", 1), equal_nan=True)
    kept = x < 0.3  # NaN compares false: a NaN pixel is kept too
    assert torch.equal(out[kept], x[kept])


def test_float32_matches_the_loop_and_the_classic_kernel():
    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, 2, 2] = 16.0
    out = masked_gaussian_blur(x, threshold=1.0)
    assert out[0, 0, 2, 2] == 4.0  # the centre weight of [1,2,1] x [1,2,1] / 16
    assert out[0, 0, 1, 1] == 0.0  # below the threshold: kept
    y = torch.rand(2, 3, 16, 16)
    torch.testing.assert_close(masked_gaussian_blur(y, threshold=0.5), loop_reference(y, 0.5, 3, "valid", 1))


@pytest.mark.parametrize(
    "border, kornia_border", [("reflect", "reflect"), ("replicate", "replicate"), ("zeros", "constant")]
)
def test_blur_everywhere_equals_kornia(border, kornia_border):
    x = torch.randn(2, 3, 10, 11, dtype=torch.float64)
    expected = kornia.filters.gaussian_blur2d(x, (5, 5), (1.1, 1.1), border_type=kornia_border)
    out = masked_gaussian_blur(x, threshold=-float("inf"), kernel_size=5, sigma=1.1, border=border)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("k, sigma", [(11, None), (13, None), (5, 1.3), (7, 0.8)])
def test_taps_match_opencv(k, sigma):
    # OpenCV derives sigma = 0.3 * ((k - 1) / 2 - 1) + 0.8 for sigma <= 0
    # (kernels above 9; smaller ones use fixed tables)
    expected = cv2.getGaussianKernel(k, 0 if sigma is None else sigma, ktype=cv2.CV_64F).ravel()
    np.testing.assert_allclose(gaussian_taps(k, sigma), expected, rtol=1e-9)
    assert gaussian_taps(3) == (0.25, 0.5, 0.25)


def test_stride_blurs_only_the_grid_and_keeps_the_shape():
    x = torch.rand(1, 1, 8, 8) + 1.0
    out = masked_gaussian_blur(x, threshold=0.0, stride=2)
    assert out.shape == x.shape
    changed = (out != x)[0, 0]
    grid = torch.zeros(8, 8, dtype=torch.bool)
    grid[1:7:2, 1:7:2] = True
    assert torch.equal(changed, grid)


def test_mask_selects_pixels_like_the_threshold():
    x = torch.randn(2, 3, 8, 9)
    torch.testing.assert_close(
        masked_gaussian_blur(x, mask=x >= 0.2, border="zeros"), masked_gaussian_blur(x, threshold=0.2, border="zeros")
    )
    channel_mask = torch.tensor([True, False, True]).view(1, 3, 1, 1)
    out = masked_gaussian_blur(x, mask=channel_mask, border="zeros")
    torch.testing.assert_close(out[:, 1], x[:, 1])
    torch.testing.assert_close(out[:, 0], masked_gaussian_blur(x, threshold=-1e9, border="zeros")[:, 0])


def test_module_and_registry_agree_with_the_functional():
    x = torch.randn(2, 3, 7, 8)
    expected = masked_gaussian_blur(x, threshold=0.1, border="reflect", stride=2)
    module = MaskedGaussianBlur(threshold=0.1, border="reflect", stride=2)
    registered = create_upsampler(
        "masked_blur", spatial_dims=2, in_channels=3, out_channels=3, scale=1, threshold=0.1, border="reflect", stride=2
    )
    torch.testing.assert_close(module(x), expected)
    torch.testing.assert_close(registered(x), expected)
    assert registered.output_shape((2, 3, 7, 8)) == (2, 3, 7, 8)


# -- gradients ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("border", ["valid", "zeros", "reflect", "replicate"])
@pytest.mark.parametrize("stride", [1, 2])
def test_gradcheck_hard_and_soft(border, stride, implementation):
    x = torch.randn(1, 2, 6, 7, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda t: masked_gaussian_blur(t, threshold=0.2, border=border, stride=stride), (x,))
    assert gradcheck(lambda t: masked_gaussian_blur(t, threshold=0.2, border=border, stride=stride, soft=0.5), (x,))
    v = torch.randn(1, 1, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    assert gradcheck(
        lambda t: masked_gaussian_blur(t, threshold=0.0, kernel_size=(3, 5, 3), border=border, stride=stride, soft=0.3),
        (v,),
    )


def test_gradcheck_float_mask_reaches_the_mask():
    x = torch.randn(1, 2, 6, 7, dtype=torch.float64, requires_grad=True)
    m = torch.rand(1, 1, 6, 7, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda t, w: masked_gaussian_blur(t, mask=w, border="replicate"), (x, m))


def test_hard_mask_gradient_goes_to_kept_and_blurred_pixels(implementation):
    x = torch.full((1, 1, 5, 5), -1.0, dtype=torch.float64, requires_grad=True)
    masked_gaussian_blur(x, threshold=0.0).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))  # nothing blurred: identity
    y = torch.full((1, 1, 5, 5), 1.0, dtype=torch.float64)
    y[0, 0, 2, 2] = -1.0  # one kept pixel in the middle
    y.requires_grad_(True)
    out = masked_gaussian_blur(y, threshold=0.0)
    out[0, 0, 2, 2].backward()
    expected = torch.zeros(5, 5, dtype=torch.float64)
    expected[2, 2] = 1.0
    assert torch.equal(y.grad[0, 0], expected)


@pytest.mark.parametrize("border", ["valid", "reflect"])
@pytest.mark.parametrize("stride", [1, 2])
def test_double_backward_hard_threshold_and_bool_mask(border, stride, implementation):
    x = torch.randn(1, 2, 6, 7, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(1, 1, 6, 7) > 0.5
    assert gradgradcheck(lambda t: masked_gaussian_blur(t, threshold=0.0, border=border, stride=stride), (x,))
    assert gradgradcheck(lambda t: masked_gaussian_blur(t, mask=mask, border=border, stride=stride), (x,))


def test_double_backward_with_soft_says_what_is_supported():
    x = torch.randn(1, 1, 6, 6, requires_grad=True)
    out = masked_gaussian_blur(x, soft=0.5)
    with pytest.raises(ConfigError, match="double backward .* for a hard threshold or a bool mask; got soft=0.5"):
        torch.autograd.grad(out.sum(), x, create_graph=True)


# -- the fused CPU kernel ----------------------------------------------------------------------------
def test_the_fused_kernel_is_built_where_a_c_compiler_is():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the PyTorch formulation serves every call")
    assert masked_blur_module.FUSED_CPU_KERNEL, (
        "pip install did not build upzoo/filters/_masked_blur_cpu.c; run `pip install -e .` again and read its output"
    )


@pytest.mark.parametrize("shape, kernel_size", [((16, 3, 64, 64), 3), ((16, 3, 64, 64), 5), ((4, 2, 16, 32, 32), 3)])
@pytest.mark.parametrize("border, stride", [("valid", 1), ("valid", 2), ("reflect", 1), ("zeros", 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_kernel_equals_the_pytorch_formulation(
    shape, kernel_size, border, stride, dtype, counting_kernel, monkeypatch
):
    # large enough for the kernel to split the planes between threads
    x = torch.randn(*shape, dtype=dtype)
    grad = torch.randn(*shape, dtype=dtype)
    options = dict(threshold=0.3, kernel_size=kernel_size, border=border, stride=stride)
    results = []
    for kernel in (counting_kernel, None):
        monkeypatch.setattr(masked_blur_module, "_cpu_kernel", kernel)
        leaf = x.clone().requires_grad_(True)
        out = masked_gaussian_blur(leaf, **options)
        out.backward(grad)
        results.append((out.detach(), leaf.grad))
    assert counting_kernel.calls == 2  # the forward and the backward ran fused
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
    torch.testing.assert_close(results[0][0], results[1][0], **tolerance)
    torch.testing.assert_close(results[0][1], results[1][1], **tolerance)


@pytest.mark.parametrize(
    "kernel_size, stride, border",
    [((5, 3, 3), (2, 1, 3), "valid"), pytest.param((3, 5, 1), (1, 2, 1), "replicate", marks=pytest.mark.slow)],
)
def test_fused_kernel_anisotropic_3d(kernel_size, stride, border, counting_kernel, monkeypatch):
    x = torch.randn(1, 2, 7, 6, 8, dtype=torch.float64, requires_grad=True)  # small: gradcheck is per input
    options = dict(threshold=0.1, kernel_size=kernel_size, stride=stride, border=border)
    assert gradcheck(lambda t: masked_gaussian_blur(t, **options), (x,))
    grad = torch.randn_like(x)
    results = []
    for kernel in (counting_kernel, None):
        monkeypatch.setattr(masked_blur_module, "_cpu_kernel", kernel)
        out = masked_gaussian_blur(x, **options)
        results.append((out, torch.autograd.grad(out, x, grad)[0]))
    assert counting_kernel.calls > 0
    torch.testing.assert_close(results[0], results[1])


@st.composite
def geometries(draw):
    dims = draw(st.sampled_from([2, 3]))
    shape = [draw(st.integers(0, 2)), draw(st.integers(1, 3))] + [draw(st.integers(1, 9)) for _ in range(dims)]
    kernel = tuple(draw(st.sampled_from([1, 3, 5])) for _ in range(dims))
    stride = tuple(draw(st.integers(1, 4)) for _ in range(dims))
    border = draw(st.sampled_from(["valid", "zeros", "reflect", "replicate"]))
    if border == "reflect":  # needs every size > kernel // 2
        shape = shape[:2] + [max(n, k // 2 + 1) for n, k in zip(shape[2:], kernel)]
    return shape, dict(kernel_size=kernel, stride=stride, border=border, threshold=draw(st.floats(-1.5, 1.5)))


@settings(max_examples=150, deadline=None)
@given(geometry=geometries())
def test_fused_kernel_equals_the_pytorch_formulation_on_any_geometry(geometry):
    """Every shape down to empty batches and one-pixel images, every border, kernel and stride."""
    if not masked_blur_module.FUSED_CPU_KERNEL:
        pytest.skip("the fused CPU kernel was not built at install (no C compiler, or its build failed)")
    shape, options = geometry
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(*shape, dtype=torch.float64)
    results = []
    for context in (contextlib.nullcontext, masked_blur_module.pytorch_formulation):
        with context():
            out = masked_gaussian_blur(x, **options)
            results.append((out, torch.autograd.grad(out, x, grad, allow_unused=True)[0]))
    torch.testing.assert_close(results[0], results[1])


def test_pytorch_formulation_block_bypasses_the_kernel_and_restores_it(counting_kernel):
    x = torch.randn(2, 3, 12, 12)
    with masked_blur_module.pytorch_formulation():
        inside = masked_gaussian_blur(x, threshold=0.3)
    assert counting_kernel.calls == 0
    torch.testing.assert_close(masked_gaussian_blur(x, threshold=0.3), inside)
    assert counting_kernel.calls == 1


@pytest.mark.parametrize("case", ["channels_last", "strided view", "bfloat16", "bool mask", "float mask", "soft"])
def test_what_the_kernel_does_not_take_runs_in_pytorch(case, counting_kernel):
    x = torch.randn(2, 3, 12, 12)
    mask = x >= 0.3
    options, expected = dict(threshold=0.3), masked_gaussian_blur(x, threshold=0.3)
    calls = counting_kernel.calls
    assert calls == 1  # the reference above ran fused
    if case == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    elif case == "strided view":
        x = torch.randn(2, 3, 12, 24)[..., ::2].copy_(x)
    elif case == "bfloat16":
        x, expected = x.bfloat16(), masked_gaussian_blur(x.bfloat16().float(), threshold=0.3).bfloat16()
        calls += 1
    elif case == "bool mask":
        options = dict(mask=mask)
    elif case == "float mask":
        options = dict(mask=mask.float())
    else:
        options, expected = dict(threshold=0.3, soft=1e-4), expected
    out = masked_gaussian_blur(x, **options)
    assert counting_kernel.calls == calls
    torch.testing.assert_close(out, expected, atol=1e-2 if case in ("bfloat16", "soft") else 1e-6, rtol=1e-2)


def _saved_tensors(fn, x):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = fn(x)
    return out, saved


@pytest.mark.parametrize("size", [16, 128])
@pytest.mark.parametrize("border", ["valid", "reflect"])
def test_one_autograd_node_and_nothing_saved_but_the_input(size, border):
    x = torch.randn(4, 3, size, size, requires_grad=True)
    out, saved = _saved_tensors(lambda t: masked_gaussian_blur(t, threshold=0.5, border=border, soft=None), x)
    assert out.grad_fn.next_functions[0][0].variable is x  # one node between the input and the output
    assert len(saved) == 1 and saved[0] is x
    out_soft, saved_soft = _saved_tensors(lambda t: masked_gaussian_blur(t, threshold=0.5, soft=0.1), x)
    assert len(saved_soft) == 1 and saved_soft[0] is x


# -- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(kernel_size=4), ConfigError, "kernel_size must be odd"),
        (dict(border="mirror"), ConfigError, "border must be one of valid, zeros, reflect, replicate, got 'mirror'"),
        (dict(stride=0), ConfigError, "stride must be a whole number >= 1"),
        (dict(soft=0.0), ConfigError, "soft must be None or a positive finite temperature"),
        (dict(soft=float("inf")), ConfigError, "soft must be None or a positive finite temperature"),
        (dict(sigma=-1.0), ConfigError, "sigma must be None, a positive finite number"),
        (dict(sigma=float("nan")), ConfigError, "sigma must be None, a positive finite number or 2 of them, got nan"),
        (
            dict(threshold="abc"),
            ConfigError,
            r"threshold must be a number \(inf and -inf allowed, not NaN\), got 'abc'",
        ),
        (dict(threshold=float("nan")), ConfigError, "threshold must be a number"),
        (
            dict(mask=torch.ones(1, 1, 3, 3, dtype=torch.bool)),
            ShapeError,
            r"mask of shape \(1, 1, 3, 3\) does not broadcast",
        ),
        (dict(mask=torch.ones(1, 1, 8, 8, dtype=torch.int64)), ConfigError, "mask must be bool"),
        (dict(mask=torch.ones(1, 1, 8, 8), soft=0.1), ConfigError, "soft applies to the threshold"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        masked_gaussian_blur(torch.randn(2, 3, 8, 8), **kwargs)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ShapeError, match=r"expects \(B, C, H, W\) or \(B, C, D, H, W\), got 3 dims"):
        masked_gaussian_blur(torch.randn(3, 8, 8))
    with pytest.raises(ConfigError, match="floating-point tensor, got torch.int64"):
        masked_gaussian_blur(torch.ones(1, 1, 8, 8, dtype=torch.int64))
    with pytest.raises(ShapeError, match="border='reflect' needs every spatial size > kernel_size // 2"):
        masked_gaussian_blur(torch.randn(1, 1, 2, 8), kernel_size=5, border="reflect")
    with pytest.raises(ConfigError, match="kernel_size must be odd"):
        MaskedGaussianBlur(kernel_size=2)
    with pytest.raises(ShapeError, match="expects 3 input channels"):
        create_upsampler("masked_blur", spatial_dims=2, in_channels=3, out_channels=3, scale=1)(torch.randn(1, 4, 8, 8))


def test_input_smaller_than_the_kernel_is_returned_unchanged():
    x = torch.randn(1, 1, 2, 2)
    torch.testing.assert_close(masked_gaussian_blur(x, threshold=-1.0), x)


def test_the_users_mask_and_input_are_never_modified():
    x = torch.randn(1, 2, 6, 7, requires_grad=True)
    for mask in (torch.rand(1, 2, 6, 7), torch.rand(1, 2, 6, 7) > 0.5):
        before_mask, before_x = mask.clone(), x.detach().clone()
        masked_gaussian_blur(x, mask=mask).backward(torch.randn(1, 2, 6, 7))
        assert torch.equal(mask, before_mask) and torch.equal(x.detach(), before_x)


def test_the_registry_entry_offers_exactly_the_module_options():
    """``masked_blur_filter`` adapts the block contract to the module's signature; its options (names,
    defaults, types) must be the module's, so the two can never drift apart."""
    import inspect
    import typing

    from upzoo.filters.masked_blur import MaskedGaussianBlur, masked_blur_filter

    contract = {"spatial_dims", "in_channels", "out_channels", "scale"}
    module = {
        k: v
        for k, v in inspect.signature(MaskedGaussianBlur).parameters.items()
        if k not in ("spatial_dims", "channels")
    }
    entry = {k: v for k, v in inspect.signature(masked_blur_filter).parameters.items() if k not in contract}
    assert {k: v.default for k, v in entry.items()} == {k: v.default for k, v in module.items()}
    hints_module = typing.get_type_hints(MaskedGaussianBlur.__init__)
    hints_entry = typing.get_type_hints(masked_blur_filter)
    assert {k: hints_entry[k] for k in entry} == {k: hints_module[k] for k in module}
