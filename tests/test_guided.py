"""Guided upsamplers (FADE, SAPA): the fast paths against slow references written from the papers'
equations with explicit loops, gradcheck, the guide in the contract, U-Nets, compile and ONNX."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from upzoo import ConfigError, ShapeError, UNet, create_upsampler
from upzoo.shapes import ShapeSolver
from upzoo.upsamplers.local_similarity import local_similarity, tiled_queries

SCALES = [2, (2, 3)]


def _pair(block, b=2, h=4, w=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    dtype = next(block.parameters()).dtype
    x = torch.randn(b, block.in_channels, h, w, generator=g, dtype=dtype)
    guide = torch.randn(b, block.guide_channels, *block.output_spatial((h, w)), generator=g, dtype=dtype)
    return x, guide


def _source(i: int, j: int, scale) -> tuple[int, int]:
    return i // scale[0], j // scale[1]


def _window(x: torch.Tensor, si: int, sj: int, k: int):
    """The k x k neighbours of (si, sj) as (offset index, (row, col) or None outside the image)."""
    r = k // 2
    out = []
    for a in range(k):
        for b in range(k):
            yi, yj = si + a - r, sj + b - r
            inside = 0 <= yi < x.shape[-2] and 0 <= yj < x.shape[-1]
            out.append((a * k + b, (yi, yj) if inside else None))
    return out


def fade_reference(block, x: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
    """FADE from its equations, point by point: semi-shift kernel logits (encoder logits at the
    point plus decoder logits at its source), softmax over the k² window, CARAFE reassembly (zeros
    outside the image), then the gate between the (aligned) encoder feature and the result."""
    k, scale = block.kernel_size, block.scale
    enc_logits = block.content(block.compress_guide(guide))  # (B, k², Hs, Ws)
    dec_logits = block.content(block.compress_x(x))  # (B, k², H, W)
    gate = torch.sigmoid(block.gate(x)) if block.gate is not None else None
    detail = block.align(guide) if block.align is not None else guide
    out = torch.zeros(x.shape[0], x.shape[1], *guide.shape[2:], dtype=x.dtype)
    for i in range(guide.shape[2]):
        for j in range(guide.shape[3]):
            si, sj = _source(i, j, scale)
            weights = torch.softmax(enc_logits[:, :, i, j] + dec_logits[:, :, si, sj], dim=1)  # (B, k²)
            for t, where in _window(x, si, sj, k):
                if where is not None:
                    out[:, :, i, j] += weights[:, t, None] * x[:, :, where[0], where[1]]
            if gate is not None:
                g = gate[:, :, si, sj]
                out[:, :, i, j] = g * detail[:, :, i, j] + (1 - g) * out[:, :, i, j]
    return block.proj(out) if block.proj is not None else out


def sapa_reference(block, x: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
    """SAPA from its equations: per output point, softmax over the neighbours of its source point of
    the similarity between the normalised encoder point and each normalised decoder point (projected
    for SAPA-B), then the weighted sum of the raw decoder features. Neighbours outside the image:
    with ``border="zeros"`` (the authors' CUDA kernels, poppinace/sapa) they stay in the softmax with
    similarity 0 and value 0; with ``border="masked"`` they take no part."""
    k, scale = block.kernel_size, block.scale

    def norm(layer, t):
        return F.layer_norm(t.permute(0, 2, 3, 1), layer.normalized_shape, layer.weight, layer.bias, layer.eps)

    q, key = norm(block.norm_guide, guide), norm(block.norm_x, x)  # channels last
    if block.query is not None:
        q = q @ block.query.weight.T + block.query.bias
        key = key @ block.key.weight.T + block.key.bias
    out = torch.zeros(x.shape[0], x.shape[1], *guide.shape[2:], dtype=x.dtype)
    for i in range(guide.shape[2]):
        for j in range(guide.shape[3]):
            si, sj = _source(i, j, scale)
            window = [where for _, where in _window(x, si, sj, k)]
            if block.border == "masked":
                window = [where for where in window if where is not None]
            zero = torch.zeros(x.shape[0], dtype=x.dtype)
            sims = torch.stack([zero if w is None else (q[:, i, j] * key[:, w[0], w[1]]).sum(-1) for w in window], 1)
            weights = torch.softmax(sims, dim=1)
            for n, where in enumerate(window):
                if where is not None:  # outside: value 0
                    out[:, :, i, j] += weights[:, n, None] * x[:, :, where[0], where[1]]
    return block.proj(out) if block.proj is not None else out


BLOCKS = [
    ("fade", {}, fade_reference),
    ("fade", {"gate": False, "kernel_size": 3}, fade_reference),
    ("sapa", {}, sapa_reference),  # guide no wider than the embedding: the query projection folded
    ("sapa", {"embedding_channels": 1}, sapa_reference),  # a wider guide: the queries projected
    ("sapa", {"variant": "inner", "kernel_size": 3}, sapa_reference),
    ("sapa", {"border": "masked"}, sapa_reference),
    ("sapa", {"variant": "inner", "kernel_size": 3, "border": "masked"}, sapa_reference),
]


def _block(name, options, scale, *, in_channels=3, out_channels=4, guide_channels=2, dtype=torch.float32):
    if options.get("variant") == "inner":
        guide_channels = in_channels
    torch.manual_seed(0)
    block = create_upsampler(
        name,
        spatial_dims=2,
        in_channels=in_channels,
        out_channels=out_channels,
        scale=scale,
        guide_channels=guide_channels,
        **{"embedding_channels": 6, **options},
    )
    return block.to(dtype)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("name, options, reference", BLOCKS, ids=lambda v: str(v) if not callable(v) else "")
def test_fast_path_equals_the_slow_reference(name, options, reference, scale):
    block = _block(name, options, scale, dtype=torch.float64)
    x, guide = _pair(block)
    with torch.no_grad():
        torch.testing.assert_close(block(x, guide), reference(block, x, guide), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name, options, reference", BLOCKS, ids=lambda v: str(v) if not callable(v) else "")
def test_gradcheck_in_float64(name, options, reference):
    block = _block(name, options, (2, 3), dtype=torch.float64)
    x, guide = _pair(block, b=1, h=3, w=3)
    assert torch.autograd.gradcheck(lambda a, g: block(a, g), (x.requires_grad_(), guide.requires_grad_()))


def test_the_guide_shapes_the_kernels():
    """Changing only the guide changes the output (the encoder feature informs the kernels)."""
    for name in ("fade", "sapa"):
        block = _block(name, {}, 2).eval()
        x, guide = _pair(block)
        assert not torch.allclose(block(x, guide), block(x, guide.flip(-1)))


def test_guide_errors_are_one_line_shape_errors():
    block = _block("fade", {}, 2)
    x, guide = _pair(block)
    with pytest.raises(ShapeError, match=r"FadeUpsampler is guided: call it as block\(x, guide\) with guide of shape"):
        block(x)
    with pytest.raises(ShapeError, match=r"expects a guide of shape \(2, 2, 8, 10\) for input \(2, 3, 4, 5\), got"):
        block(x, guide[..., :-1])
    with pytest.raises(ConfigError, match="'fade' is guided by a high-resolution feature: give guide_channels="):
        create_upsampler("fade", spatial_dims=2, in_channels=3, out_channels=3, scale=2)
    with pytest.raises(ConfigError, match="variant 'inner' compares features directly"):
        create_upsampler(
            "sapa", spatial_dims=2, in_channels=3, out_channels=3, scale=2, guide_channels=4, variant="inner"
        )
    unguided = create_upsampler("interp_conv", spatial_dims=2, in_channels=3, out_channels=3, scale=2)
    torch.testing.assert_close(unguided(x, guide), unguided(x))  # a guide is accepted and unused


@pytest.mark.parametrize("name", ["fade", "sapa"])
def test_unets_pass_their_skips_and_the_shape_tools_follow(name):
    net = UNet(spatial_dims=2, in_channels=3, num_classes=2, channels=(4, 8, 16), upsampler=name).eval()
    assert [stage.upsample.guide_channels for stage in net.decoder] == [8, 4]
    assert net(torch.randn(1, 3, 37, 50)).shape == (1, 2, 37, 50)
    solver = ShapeSolver(net)
    assert solver.path == "analytic" and solver.rule(0).describe() == "multiples of 4"
    with pytest.raises(ConfigError, match=rf"UNet decoder stage 4: '{name}' is guided by the encoder skip"):
        UNet(spatial_dims=2, in_channels=3, num_classes=2, encoder="resnet18", upsampler=name)


@pytest.mark.parametrize("name", ["fade", "sapa"])
def test_compile_fullgraph_forward_and_backward_equal_eager(name):
    block = _block(name, {}, 2)
    x, guide = _pair(block)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager", dynamic=False)
    eager_x, compiled_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected, got = block(eager_x, guide), compiled(compiled_x, guide)
    torch.testing.assert_close(got, expected)
    expected.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(compiled_x.grad, eager_x.grad)


@pytest.mark.parametrize("name", ["fade", "sapa"])
def test_onnx_export_matches_pytorch_in_onnxruntime(name, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    block = _block(name, {}, 2).eval()
    x, guide = _pair(block, b=1, h=6, w=7)
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(
        block, (x, guide), str(path), input_names=["x", "guide"], output_names=["y"], dynamo=True, verbose=False
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x.numpy(), "guide": guide.numpy()})
    with torch.no_grad():
        expected = block(x, guide).numpy()
    assert math.isclose(float(abs(y - expected).max()), 0.0, abs_tol=1e-4)


def _direct_similarity(guide: torch.Tensor, keys: torch.Tensor, scale, k: int) -> torch.Tensor:
    """``sim[p, r, o] = <guide at output point (p, r), key at p + o>`` (zero outside), one
    sub-position and one offset at a time: ``(B, *S, r, k^n)``."""
    b, *spatial, d = keys.shape
    n, half = len(spatial), k // 2
    padded = F.pad(keys, [0, 0] + [half] * 2 * n)
    out = []
    for sub in itertools.product(*(range(r) for r in scale)):
        query = guide[(slice(None), slice(None), *(slice(j, None, r) for j, r in zip(sub, scale)))].movedim(1, -1)
        row = []
        for off in itertools.product(range(k), repeat=n):
            neighbour = padded[(slice(None), *(slice(o, o + s) for o, s in zip(off, spatial)))]
            row.append((query * neighbour).sum(-1))
        out.append(torch.stack(row, dim=-1))
    return torch.stack(out, dim=-2)


@pytest.mark.parametrize(
    "spatial, scale, k, tile",
    [((5, 7), (2, 2), 5, 4), ((4, 4), (2, 3), 3, 4), ((3, 9), (2, 2), 7, 4), ((1, 2), (2, 2), 5, 4),
     ((6, 5), (1, 2), 1, 2), ((3, 5, 4), (1, 2, 2), 3, 2), ((2, 3, 3), (2, 2, 2), 5, 2), ((5,), (3,), 3, 4),
     ((4, 5), (2, 3), 5, 1), ((2, 3, 3), (1, 2, 2), 3, 1)],  # tile 1: the traced graphs' path
)  # fmt: skip
def test_tiled_local_similarity_equals_its_definition(spatial, scale, k, tile):
    """Any size (whole tiles or not, smaller than a tile), kernel and tile: SAPA's tiled similarity
    is the neighbourhood product of its definition, in float64 (forward and gradients)."""
    g = torch.Generator().manual_seed(0)
    guide = torch.randn(2, 3, *(s * r for s, r in zip(spatial, scale)), generator=g, dtype=torch.float64)
    keys = torch.randn(2, *spatial, 3, generator=g, dtype=torch.float64)
    got = local_similarity(tiled_queries(guide, scale, tile), keys, k, tile)
    torch.testing.assert_close(got, _direct_similarity(guide, keys, scale, k), rtol=1e-12, atol=1e-12)
    weights = torch.randn(got.shape, generator=g, dtype=torch.float64)
    grads = []
    tiled = lambda a, b: local_similarity(tiled_queries(a, scale, tile), b, k, tile)  # noqa: E731
    for fn in (tiled, lambda a, b: _direct_similarity(a, b, scale, k)):
        a, b = guide.clone().requires_grad_(), keys.clone().requires_grad_()
        grads.append(torch.autograd.grad((fn(a, b) * weights).sum(), (a, b)))
    for got_grad, expected_grad in zip(*grads):
        torch.testing.assert_close(got_grad, expected_grad, rtol=1e-12, atol=1e-12)
