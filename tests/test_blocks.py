"""Every registered block x spatial dims x scale: shapes, gradients, dtypes, memory formats, errors."""

from __future__ import annotations

import math

import pytest
import torch

import upzoo
from upzoo import ConfigError, RegistryError, ShapeError, UpzooError, create_upsampler, list_upsamplers
from upzoo.registry import upsampler_info

SCALES = {2: [2, (1, 2), (2, 3)], 3: [2, (1, 2, 2), (2, 1, 3)]}
ODD_SIZES = {2: (5, 7), 3: (3, 5, 7)}


def _keeps_channels(name: str) -> bool:
    return upsampler_info(name).keeps_channels


def _cases():
    for name in list_upsamplers():
        info = upsampler_info(name)
        for dims in info.spatial_dims:
            scales = [1] if info.kind == "post_filter" else SCALES[dims]
            for scale in scales:
                yield pytest.param(name, dims, scale, id=f"{name}-{dims}d-{scale}")


GUIDE_CHANNELS = 3
STYLE_DIM = 5


def _build(name: str, dims: int, scale, in_channels: int = 8, **options):
    out_channels = in_channels if _keeps_channels(name) else 6
    if upsampler_info(name).needs_guide:
        options = {"guide_channels": GUIDE_CHANNELS, **options}
    if upsampler_info(name).needs_style:  # StyleGAN2's own form at x2, a block then the modulated conv elsewhere
        options = {"style_dim": STYLE_DIM, "form": "stylegan2" if scale == 2 else "after", **options}
    return create_upsampler(
        name, spatial_dims=dims, in_channels=in_channels, out_channels=out_channels, scale=scale, **options
    )


def _run(block, x: torch.Tensor) -> torch.Tensor:
    """``block(x)``; a guided block gets a random guide of the shape it expects, a style-conditioned
    one a random style."""
    if getattr(block, "needs_style", False):
        return block(x, torch.randn(x.shape[0], STYLE_DIM, dtype=x.dtype))
    if not block.needs_guide:
        return block(x)
    b, _, *spatial = x.shape
    guide = torch.randn(b, GUIDE_CHANNELS, *block.output_spatial(tuple(spatial)), dtype=x.dtype)
    channels_last = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    return block(x, guide.contiguous(memory_format=torch.contiguous_format if x.is_contiguous() else channels_last))


def _expected_spatial(dims, scale, sizes):
    scale = (scale,) * dims if isinstance(scale, int) else scale
    return tuple(s * k for s, k in zip(sizes, scale))


@pytest.mark.parametrize("name, dims, scale", list(_cases()))
def test_forward_shape_matches_output_shape_and_scale(name, dims, scale):
    block = _build(name, dims, scale)
    x = torch.randn(2, 8, *ODD_SIZES[dims])
    y = _run(block, x)
    assert tuple(y.shape) == block.output_shape(tuple(x.shape))
    assert tuple(y.shape[2:]) == _expected_spatial(dims, scale, ODD_SIZES[dims])
    assert y.shape[1] == block.out_channels
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name, dims, scale", list(_cases()))
def test_every_parameter_receives_gradient(name, dims, scale):
    block = _build(name, dims, scale)
    x = torch.randn(2, 8, *ODD_SIZES[dims], requires_grad=True)
    y = _run(block, x)
    (y * torch.randn_like(y)).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for pname, p in block.named_parameters():
        assert p.grad is not None, f"{name}.{pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}.{pname} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name}.{pname} got an all-zero gradient"


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name, dims, scale", list(_cases()))
def test_dtype_is_preserved(name, dims, scale, dtype):
    block = _build(name, dims, scale).to(dtype)
    x = torch.randn(1, 8, *ODD_SIZES[dims], dtype=dtype)
    try:
        y = _run(block, x)
    except (RuntimeError, NotImplementedError) as exc:
        if dtype is torch.bfloat16 and "not implemented" in str(exc).lower():
            pytest.skip(f"PyTorch has no CPU {dtype} kernel here: {exc}")
        raise
    assert y.dtype == dtype


@pytest.mark.parametrize("name, dims, scale", list(_cases()))
def test_channels_last_input_gives_the_same_output(name, dims, scale):
    block = _build(name, dims, scale)
    x = torch.randn(2, 8, *ODD_SIZES[dims])
    fmt = torch.channels_last if dims == 2 else torch.channels_last_3d
    torch.manual_seed(0)
    expected = _run(block, x)
    torch.manual_seed(0)
    torch.testing.assert_close(_run(block, x.to(memory_format=fmt)), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list_upsamplers())
def test_output_shape_agrees_with_forward_on_many_sizes(name):
    info = upsampler_info(name)
    for dims in info.spatial_dims:
        scale = 1 if info.kind == "post_filter" else SCALES[dims][-1]
        block = _build(name, dims, scale, in_channels=4)
        for sizes in [(1,) * dims, (2,) * dims, (3, 8, 5)[:dims], (9, 4, 6)[:dims]]:
            x = torch.randn(1, 4, *sizes)
            assert tuple(_run(block, x).shape) == block.output_shape(x.shape)


# -- bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list_upsamplers())
def test_wrong_ndim_is_a_shape_error(name):
    dims = upsampler_info(name).spatial_dims[0]
    block = _build(name, dims, 1 if upsampler_info(name).kind == "post_filter" else 2)
    bad = torch.randn(2, 8, *([5] * (dims + 1)))
    with pytest.raises(ShapeError, match=rf"expects a {dims}D batch .* got {dims + 3} dims"):
        block(bad)
    with pytest.raises(ShapeError, match="dims"):
        block.output_shape((8, 5))


@pytest.mark.parametrize("name", list_upsamplers())
def test_wrong_channel_count_is_a_shape_error(name):
    dims = upsampler_info(name).spatial_dims[0]
    block = _build(name, dims, 1 if upsampler_info(name).kind == "post_filter" else 2)
    with pytest.raises(ShapeError, match=r"expects 8 input channels .* got 5"):
        block(torch.randn(1, 5, *([4] * dims)))


@pytest.mark.parametrize("name", list_upsamplers(kind="upsampler"))
@pytest.mark.parametrize(
    "scale, message",
    [
        (0, "scale must be a whole number >= 1"),
        (-2, "scale must be"),
        (1.5, "scale must be"),
        ((2, 2, 2, 2), "one value per spatial axis"),
        ((2, 0), "scale must be"),
        ("2", "scale must be"),
    ],
)
def test_bad_scale_is_a_config_error(name, scale, message):
    dims = upsampler_info(name).spatial_dims[0]
    with pytest.raises(ConfigError, match=message):
        _build(name, dims, scale)


@pytest.mark.parametrize("name", list_upsamplers())
def test_unknown_option_lists_the_options(name):
    dims = upsampler_info(name).spatial_dims[0]
    with pytest.raises(RegistryError, match=rf"'{name}' has no option 'no_such_option'; its options are"):
        _build(name, dims, 1 if upsampler_info(name).kind == "post_filter" else 2, no_such_option=3)


def test_unsupported_spatial_dims_and_channels():
    with pytest.raises(ConfigError, match=r"supports spatial_dims in \(2, 3\), got 1"):
        create_upsampler("carafe", spatial_dims=1, in_channels=4, out_channels=4, scale=2)
    with pytest.raises(ConfigError, match="in_channels must be a whole number >= 1, got 0"):
        create_upsampler("transposed", spatial_dims=2, in_channels=0, out_channels=4, scale=2)
    with pytest.raises(ConfigError, match="out_channels must equal in_channels"):
        create_upsampler("interpolate", spatial_dims=2, in_channels=4, out_channels=3, scale=2)
    with pytest.raises(ConfigError, match="scale must be 1"):
        create_upsampler("masked_blur", spatial_dims=2, in_channels=4, out_channels=4, scale=2)
    assert issubclass(ShapeError, UpzooError) and issubclass(RegistryError, UpzooError)


def test_public_api_is_curated():
    for name in [
        "create_upsampler",
        "list_upsamplers",
        "register_upsampler",
        "masked_gaussian_blur",
        "MaskedGaussianBlur",
        "UpzooError",
        "ConfigError",
        "RegistryError",
        "ShapeError",
        "DataError",
    ]:
        assert name in upzoo.__all__ and hasattr(upzoo, name)
    assert (
        math.prod(
            create_upsampler("pixel_shuffle", spatial_dims=3, in_channels=2, out_channels=2, scale=(1, 2, 3)).scale
        )
        == 6
    )
