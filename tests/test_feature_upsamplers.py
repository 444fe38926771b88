"""The image-guided feature upsamplers (JBU, JAFAR, LoftUp, AnyUp) against references written from
the papers' equations with explicit loops or PyTorch's own layers; chunked equals whole (values and
gradients); any ratio; AnyUp's feature-agnostic weights; bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from upzoo import ConfigError, ShapeError, create_upsampler
from upzoo.upsamplers.anyup import FeatureUnification
from upzoo.upsamplers.feature_attention import AxialRope, window_mask
from upzoo.upsamplers.jbu import stage_factors

FEATURE_BLOCKS = ["jbu", "jafar", "loftup", "anyup"]
SMALL = {"jafar": {"qk_dim": 16}, "anyup": {"qk_dim": 16}, "loftup": {"width": 16, "frequencies": 4}, "jbu": {}}


def _block(name, scale, in_channels=6, out_channels=6, **options):
    torch.manual_seed(0)
    return create_upsampler(
        name, spatial_dims=2, in_channels=in_channels, out_channels=out_channels, scale=scale, guide_channels=3,
        **{**SMALL[name], **options},
    ).double()  # fmt: skip


def _pair(block, h=3, w=4, b=2, ratio=None):
    g = torch.Generator().manual_seed(1)
    r = block.scale if ratio is None else ratio
    x = torch.randn(b, block.in_channels, h, w, generator=g, dtype=torch.float64)
    return x, torch.rand(b, 3, h * r[0], w * r[1], generator=g, dtype=torch.float64)


@pytest.mark.parametrize("name", FEATURE_BLOCKS)
@pytest.mark.parametrize("scale, chunk", [(2, 1), ((2, 3), 4), (14, 5), (16, 7)])
def test_chunked_equals_whole_in_values_and_gradients(name, scale, chunk):
    block = _block(name, scale, out_channels=5)
    x, guide = _pair(block, h=2, w=3)
    results = []
    for c in (None, chunk):
        block.chunk = c
        xs, gs = x.clone().requires_grad_(), guide.clone().requires_grad_()
        y = block(xs, gs)
        (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
        grads = [p.grad.clone() for p in block.parameters()]
        block.zero_grad()
        results.append((y.detach(), xs.grad, gs.grad, grads))
    (y0, gx0, gg0, p0), (y1, gx1, gg1, p1) = results
    with torch.no_grad():  # inference writes the bands into one output (training checkpoints them)
        block.chunk = chunk
        torch.testing.assert_close(block(x, guide), y0, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(y1, y0, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(gx1, gx0, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(gg1, gg0, rtol=1e-9, atol=1e-11)
    for a, b in zip(p1, p0):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name", FEATURE_BLOCKS)
def test_resample_at_another_ratio_and_its_errors(name):
    block = _block(name, 16)
    x, guide = _pair(block, ratio=(2, 4))
    assert block.resample(x, guide, (2, 4)).shape == (2, 6, 6, 16)
    with pytest.raises(
        ShapeError, match=r"resample at ratio \(2, 2\): expected x \(B, \S+, h, w\) and a guide \(2, 3, 6, 8\)"
    ):
        block.resample(x, guide, 2)
    with pytest.raises(ShapeError, match="guide of shape"):
        block(x, guide)  # the block's own scale is 16


@pytest.mark.parametrize("name", FEATURE_BLOCKS)
def test_bad_options_are_config_errors(name):
    with pytest.raises(ConfigError, match="chunk must be a whole number >= 1, got 0"):
        _block(name, 2, chunk=0)
    with pytest.raises(ConfigError, match="supports spatial_dims in \\(2,\\)"):
        create_upsampler(name, spatial_dims=3, in_channels=4, out_channels=4, scale=2, guide_channels=3)


def test_stage_factors():
    assert stage_factors((16, 16)) == [(2, 2)] * 4
    assert stage_factors((14, 14)) == [(2, 2), (7, 7)]
    assert stage_factors((16, 14)) == [(2, 2), (2, 7), (2, 1), (2, 1)]
    assert stage_factors((1, 3)) == [(1, 3)]


def jbu_stage_reference(block, x, guide, factor):
    """One JBU stage from FeatUp's equations, pixel by pixel: the bicubic-upsampled source (PyTorch's
    interpolate) and the guide's range projection, the window around each output pixel with the edge
    repeated, the range softmax times the spatial Gaussian, normalised, plus the fix-up term."""
    r = block.radius
    source = F.interpolate(x, scale_factor=factor, mode="bicubic", align_corners=False)
    keys = block.range_proj(guide)
    b, c, height, width = source.shape
    temperature = block.range_temperature.exp().clamp(1e-4, 1e4)
    out = torch.zeros(b, c, height, width, dtype=x.dtype)
    for i in range(height):
        for j in range(width):
            nb = [
                (min(max(i + u, 0), height - 1), min(max(j + v, 0), width - 1))
                for u in range(-r, r + 1)
                for v in range(-r, r + 1)
            ]
            offsets = [(u, v) for u in range(-r, r + 1) for v in range(-r, r + 1)]
            scores = torch.stack([(keys[:, :, p, q] * keys[:, :, i, j]).sum(1) for p, q in nb], 1)
            spatial = torch.tensor(
                [math.exp(-(u * u + v * v) / r**2 / (2 * float(block.sigma_spatial) ** 2)) for u, v in offsets],
                dtype=x.dtype,
            )
            kernel = (scores * temperature).softmax(1) * spatial
            kernel = kernel / kernel.sum(1, keepdim=True)
            fixup = block.kernel_fixup(torch.cat([kernel, guide[:, :, i, j]], 1)[..., None, None])[..., 0, 0]
            kernel = kernel + 0.1 * (fixup - fixup.mean(1, keepdim=True))  # centred: sums to 1
            out[:, :, i, j] = sum(kernel[:, t, None] * source[:, :, p, q] for t, (p, q) in enumerate(nb))
    return out


def test_jbu_stage_equals_its_equations_pixel_by_pixel():
    block = _block("jbu", 2, radius=2)
    with torch.no_grad():
        block.sigma_spatial.fill_(0.7)
        block.range_temperature.fill_(0.4)
    x, guide = _pair(block, h=3, w=4, b=1)
    with torch.no_grad():
        torch.testing.assert_close(block.stage(x, guide, (2, 2)), jbu_stage_reference(block, x, guide, (2, 2)))


def test_jbu_kernels_sum_to_one_so_a_stack_keeps_the_features_scale():
    """The fix-up may reshape a kernel but not change its sum: with an uncentred fix-up a JBU trained at
    x2/x4 learned kernels summing to 0.29, and the four shared stages at x16 shrank the features 135-fold."""
    block = _block("jbu", 16)
    with torch.no_grad():
        block.kernel_fixup[-1].bias.fill_(-0.5)  # a fix-up that would shrink every kernel (as the trained one did)
        block.range_temperature.fill_(1.0)
    x, guide = _pair(block, h=2, w=3, b=2)
    with torch.no_grad():
        sums = block.kernel(F.avg_pool2d(guide, 8), None).sum(1)
        torch.testing.assert_close(sums, torch.ones_like(sums))
        constant = torch.full_like(x, 0.7)
        lifted = constant
        for size in (8, 4, 2, 1):
            lifted = block.stage(lifted, F.avg_pool2d(guide, size), (2, 2))
        assert lifted.shape[-2:] == guide.shape[-2:]
        torch.testing.assert_close(lifted, torch.full_like(lifted, 0.7))


def test_jbu_with_a_point_kernel_is_bicubic_stage_by_stage():
    """With the spatial Gaussian narrowed to the centre tap and no fix-up or residual, JBU at x16 is
    four bicubic x2 steps: the stages, the guide's pooling and the border add nothing of their own."""
    block = _block("jbu", 16)
    with torch.no_grad():
        block.sigma_spatial.fill_(0.05)
        for layer in (block.kernel_fixup[-1], block.residual):
            layer.weight.zero_()
            layer.bias.zero_()
    x, guide = _pair(block, h=2, w=3, b=1)
    expected = x
    for _ in range(4):
        expected = F.interpolate(expected, scale_factor=2, mode="bicubic", align_corners=False)
    with torch.no_grad():
        torch.testing.assert_close(block(x, guide), expected)


def test_jbu_is_its_stages_then_the_residual():
    block = _block("jbu", 4)
    x, guide = _pair(block, h=2, w=3, b=1)
    with torch.no_grad():
        half = block.stage(x, F.avg_pool2d(guide, 2), (2, 2))
        full = block.stage(half, guide, (2, 2))
        torch.testing.assert_close(block(x, guide), full + 0.1 * block.residual(full))
        torch.testing.assert_close(block(x, guide), block.stage(half, guide, (2, 2), last=True))


def test_rotary_encoding_scores_depend_only_on_the_offset():
    rope = AxialRope(16).double()
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)

    def score(p, s):
        rq = rope(q, torch.tensor([p[0]], dtype=torch.float64), torch.tensor([p[1]], dtype=torch.float64))
        rk = rope(k, torch.tensor([s[0]], dtype=torch.float64), torch.tensor([s[1]], dtype=torch.float64))
        return float((rq * rk).sum())

    assert score((0.1, 0.3), (0.4, 0.2)) == pytest.approx(score((0.5, 0.6), (0.8, 0.5)), abs=1e-12)
    assert score((0.1, 0.3), (0.4, 0.2)) != pytest.approx(score((0.1, 0.3), (0.7, 0.2)), abs=1e-3)
    rotated = rope(q, torch.tensor([0.37], dtype=torch.float64), torch.tensor([0.81], dtype=torch.float64))
    assert float(rotated.norm()) == pytest.approx(float(q.norm()), abs=1e-12)


def jafar_reference(block, x, guide):
    """JAFAR from its equations, query by query: the rotary-encoded image encoding; keys pooled over
    each cell's pixels, SFT-modulated; per head a softmax over all cells; the output the head-averaged
    weights times the raw features."""
    b, c, h, w = x.shape
    height, width = guide.shape[-2:]
    r = (height // h, width // w)
    rows = (torch.arange(height, dtype=x.dtype) + 0.5) / height
    cols = (torch.arange(width, dtype=x.dtype) + 0.5) / width
    encoded = block.rope(block.image_encoder(guide.permute(0, 2, 3, 1)), rows, cols)
    key_pixels = block.key_encoder(encoded)
    pooled = torch.stack(
        [
            torch.stack(
                [key_pixels[:, i * r[0] : (i + 1) * r[0], j * r[1] : (j + 1) * r[1]].mean((1, 2)) for j in range(w)], 1
            )
            for i in range(h)
        ],
        1,
    )
    keys = block.keys(x, pooled).flatten(1, 2)
    queries = block.query_conv(F.pad(block.query_norm(block.query_encoder(encoded)).permute(0, 3, 1, 2), (0, 0, 1, 1)))
    att, heads = block.attention, block.attention.heads
    d = keys.shape[-1] // heads
    q_all = att.q(att.norm_q(queries.permute(0, 2, 3, 1)))
    k_all = att.k(att.norm_k(keys))
    values = x.flatten(2).transpose(1, 2)
    out = torch.zeros(b, c, height, width, dtype=x.dtype)
    for i in range(height):
        for j in range(width):
            weights = 0
            for head in range(heads):
                qh, kh = q_all[:, i, j, head * d : (head + 1) * d], k_all[:, :, head * d : (head + 1) * d]
                weights = weights + torch.softmax((kh @ qh[..., None])[..., 0] / math.sqrt(d), dim=1) / heads
            out[:, :, i, j] = (weights[:, :, None] * values).sum(1)
    return out


def test_jafar_equals_its_equations_query_by_query():
    block = _block("jafar", (2, 3))
    x, guide = _pair(block, h=2, w=3)
    with torch.no_grad():
        torch.testing.assert_close(block(x, guide), jafar_reference(block, x, guide))


def test_jafar_output_is_a_convex_combination_of_the_features():
    block = _block("jafar", 4)
    x, guide = _pair(block, h=2, w=2, b=1)
    x = torch.zeros_like(x) + torch.tensor([1.0, -2, 3, 0, 5, 7], dtype=x.dtype)[:, None, None]
    with torch.no_grad():  # every feature vector the same: every output pixel is that vector
        torch.testing.assert_close(block(x, guide), x[..., :1, :1].expand(-1, -1, 8, 8))


def test_anyup_window_mask_equals_a_loop_over_queries_and_cells():
    rows, cols = (torch.arange(7) + 0.5) / 7, (torch.arange(5) + 0.5) / 5
    mask = window_mask(rows, cols, 3, 4, 0.13)  # no window edge on a cell edge
    for qi, p in enumerate(rows.tolist()):
        for qj, s in enumerate(cols.tolist()):
            for ci in range(3):
                for cj in range(4):
                    r0, r1 = math.floor(min(max(p - 0.13, 0), 1) * 3), math.ceil(min(max(p + 0.13, 0), 1) * 3)
                    c0, c1 = math.floor(min(max(s - 0.13, 0), 1) * 4), math.ceil(min(max(s + 0.13, 0), 1) * 4)
                    assert bool(mask[qi * 5 + qj, ci * 4 + cj]) == (r0 <= ci < r1 and c0 <= cj < c1)


def test_anyup_attends_only_inside_its_window():
    block = _block("anyup", 4, window=0.1)
    x, guide = _pair(block, h=8, w=8, b=1)
    x2 = x.clone()
    x2[..., 7, 7] += 100.0  # the far corner cell changes; keys see 3 cells around (5x5 filters, a 3x3 conv)
    with torch.no_grad():
        y, y2 = block(x, guide), block(x2, guide)
    assert torch.equal(y[..., :8, :8], y2[..., :8, :8])  # windows of the top-left cells 0-2: unchanged
    assert not torch.equal(y[..., 24:, 24:], y2[..., 24:, 24:])
    block.window = 1.0  # global attention: every pixel sees the change
    with torch.no_grad():
        assert not torch.equal(block(x, guide)[..., :8, :8], block(x2, guide)[..., :8, :8])


def test_feature_unification_equals_a_loop_over_channels_and_takes_any_width():
    torch.manual_seed(0)
    unify = FeatureUnification(8, kernel_size=3, group=2).double()
    x = torch.randn(2, 5, 4, 6, dtype=torch.float64)
    taps = F.conv2d(F.pad(torch.ones(1, 1, 4, 6, dtype=x.dtype), (1,) * 4), torch.ones(1, 1, 3, 3, dtype=x.dtype))
    expected = sum(
        (F.conv2d(F.pad(x[:, c : c + 1], (1,) * 4), unify.basis) / taps).softmax(dim=1) for c in range(5)
    ) / 5  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(unify(x), expected)
    block = _block("anyup", 4)  # no projection: the same weights for any backbone width
    for width in (6, 11):
        x, guide = torch.randn(1, width, 2, 3, dtype=torch.float64), torch.rand(1, 3, 8, 12, dtype=torch.float64)
        assert block.resample(x, guide, 4).shape == (1, width, 8, 12)


def test_loftup_attention_layer_equals_torch_multihead_attention():
    block = _block("loftup", 2)
    layer = block.layers[0]
    mha = torch.nn.MultiheadAttention(16, 4, kdim=26, vdim=26, batch_first=True).double()
    with torch.no_grad():
        mha.q_proj_weight.copy_(layer.q.weight)
        mha.k_proj_weight.copy_(layer.k.weight)
        mha.v_proj_weight.copy_(layer.v.weight)
        mha.in_proj_bias.copy_(torch.cat([layer.q.bias, layer.k.bias, layer.v.bias]))
        mha.out_proj.weight.copy_(layer.out.weight)
        mha.out_proj.bias.copy_(layer.out.bias)
        queries, kv = torch.randn(2, 9, 16, dtype=torch.float64), torch.randn(2, 5, 26, dtype=torch.float64)
        attended = queries + mha(layer.norm_q(queries), layer.norm_kv(kv), layer.norm_kv(kv), need_weights=False)[0]
        torch.testing.assert_close(layer(queries, kv), attended + layer.feed_forward(attended))


def test_loftup_width_must_divide_into_heads():
    with pytest.raises(ConfigError, match=r"loftup width \(18\) must be divisible by heads \(4\); set width, e.g. 20"):
        _block("loftup", 2, width=18)


def test_anyup_window_is_a_fraction():
    for bad in (0, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="anyup window is a fraction of the image side in \\(0, 1\\]"):
            _block("anyup", 2, window=bad)
    for bad in (True, "0.1"):
        with pytest.raises(ConfigError, match=r"anyup.window: expected a number, got"):
            _block("anyup", 2, window=bad)


def test_pixel_coordinates_stay_float32_under_bf16():
    """JAFAR and AnyUp rotate queries and keys by their pixel coordinates, AnyUp's windows and
    LoftUp's Fourier features read them too: in bf16, 448 rows fall on 288 distinct values."""
    from upzoo.upsamplers.feature_attention import window_mask
    from upzoo.upsamplers.image_guided import pixel_centres

    like = torch.zeros(1, dtype=torch.bfloat16)
    rows = pixel_centres(0, 448, 448, like)
    assert rows.dtype == torch.float32 and len(rows.unique()) == 448
    rounded = ((torch.arange(448, dtype=torch.bfloat16) + 0.5) / 448).float()  # what bf16 coordinates were
    assert len(rounded.unique()) < 300
    assert not torch.equal(window_mask(rows, rows[:8], 32, 32, 0.01), window_mask(rounded, rows[:8], 32, 32, 0.01))
    seen = []
    options = {"spatial_dims": 2, "in_channels": 8, "out_channels": 8, "scale": 14, "guide_channels": 3}
    jafar = create_upsampler("jafar", qk_dim=16, **options)
    original = type(jafar.rope).forward
    jafar.rope.forward = lambda x, r, c: seen.append((r.dtype, len(r.unique()))) or original(jafar.rope, x, r, c)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        encoded = jafar.encoded(torch.rand(1, 3, 448, 14).to(torch.bfloat16), 0, 448)
    assert seen == [(torch.float32, 448)] and encoded.dtype == torch.bfloat16
    loftup = create_upsampler("loftup", **options)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inputs = loftup._inputs(torch.rand(1, 3, 448, 14).to(torch.bfloat16), 0, 448)
    assert inputs.dtype == torch.bfloat16 and torch.isfinite(inputs.float()).all()


def test_messages_name_the_guide_each_block_takes_and_only_real_spatial_dims():
    jafar = create_upsampler("jafar", spatial_dims=2, in_channels=8, out_channels=8, scale=2, guide_channels=3)
    with pytest.raises(ShapeError, match=r"guide of shape \(1, 3, 8, 8\) \(the image itself, 3 channels in \[0, 1\]"):
        jafar(torch.rand(1, 8, 4, 4))
    fade = create_upsampler("fade", spatial_dims=2, in_channels=8, out_channels=8, scale=2, guide_channels=4)
    with pytest.raises(ShapeError, match=r"\(the encoder feature at the output resolution\)"):
        fade(torch.rand(1, 8, 4, 4))
    with pytest.raises(ConfigError, match=r"3 for the image-guided jbu, jafar, loftup and anyup, whose guide is the"):
        create_upsampler("anyup", spatial_dims=2, in_channels=8, out_channels=8, scale=2)
    block = create_upsampler("zero_insertion", spatial_dims=2, in_channels=4, out_channels=4, scale=2)
    with pytest.raises(ShapeError, match=r"got 3 dims \(1, 4, 5\); add the batch/channel axes$"):
        block(torch.zeros(1, 4, 5))
    with pytest.raises(ShapeError, match=r"add the batch/channel axes or build it with spatial_dims=3$"):
        block(torch.zeros(1, 4, 5, 5, 5))
    with pytest.raises(ShapeError, match=r"got 5 dims \(1, 8, 4, 4, 4\); add the batch/channel axes$"):
        jafar(torch.rand(1, 8, 4, 4, 4))  # JAFAR has no 3D form to suggest


@pytest.mark.parametrize("name", ["jbu", "jafar", "loftup", "anyup"])
def test_image_guided_blocks_refuse_what_would_come_back_wrong(name):
    block = create_upsampler(name, spatial_dims=2, in_channels=8, out_channels=8, scale=2, guide_channels=3)
    x, guide = torch.rand(1, 8, 4, 4), torch.rand(1, 3, 8, 8)
    nan = x.clone()
    nan[0, 0, 0, 0] = float("nan")
    cases = [
        ((nan, guide), r"the features: 1 of 128 values are NaN or infinite"),
        ((x, guide.clone().fill_(float("inf"))), r"the guide: 192 of 192 values are NaN or infinite"),
        ((x.double(), guide), r"the features are torch.float64 and the guide torch.float32; give both one dtype"),
        ((x, guide.half()), r"the features are torch.float32 and the guide torch.float16"),
        (((x * 10).long(), guide), r"the features must be floats, got torch.int64; convert with .float\(\)"),
        ((x, guide * 255), r"the guide reaches \|2\d\d.*, beyond any normalised image .* divide 0-255 pixels by 255"),
    ]
    for (features, image), message in cases:
        with pytest.raises(ConfigError, match=message):
            block(features, image)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast mixes dtypes on purpose
        assert block(x.bfloat16(), guide).shape == (1, 8, 8, 8)
    imagenet = (guide - 0.485) / 0.229  # a normalised image passes: [-2.1, 2.2]
    assert block(x, imagenet).shape == block(x, guide * 2 - 1).shape == (1, 8, 8, 8)
