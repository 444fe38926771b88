"""FPN, UPerNet, SegFormer and DeepLabV3+ with registered blocks at their upsampling points: equal to
smp's models with smp's resize, every block at every point, guides at the output resolution, the
input policy, the size rule, recipes and the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import segmentation_models_pytorch as smp
import torch
from PIL import Image

from upzoo import ConfigError
from upzoo.errors import RegistryError, ShapeError
from upzoo.models import smp_deeplabv3plus, smp_fpn, smp_segformer, smp_unet, smp_upernet
from upzoo.models.factory import ModelSpec, build_model
from upzoo.models.smp_decoders import DECODER_POINTS
from upzoo.registry import list_upsamplers, upsampler_info
from upzoo.shapes import ShapeSolver
from upzoo.upsamplers.catalog import describe_blocks

#: (builder, smp class, encoder, small decoder widths) per decoder
DECODERS = {
    "fpn": (smp_fpn, smp.FPN, "resnet18", {"decoder_pyramid_channels": 32, "decoder_segmentation_channels": 32}),
    "upernet": (smp_upernet, smp.UPerNet, "resnet18", {"decoder_channels": 32}),
    "segformer": (smp_segformer, smp.Segformer, "mit_b0", {"decoder_segmentation_channels": 32}),
    "segformer-cnn": (smp_segformer, smp.Segformer, "resnet18", {"decoder_segmentation_channels": 32}),
    "deeplabv3plus": (smp_deeplabv3plus, smp.DeepLabV3Plus, "resnet18", {"decoder_channels": 32}),
}
BLOCKS_2D = [n for n in list_upsamplers(kind="upsampler")
             if 2 in upsampler_info(n).spatial_dims and not upsampler_info(n).needs_style]  # fmt: skip


def _pair(key, mode):
    builder, reference_class, encoder, widths = DECODERS[key]
    torch.manual_seed(0)
    reference = getattr(reference_class(encoder_name=encoder, encoder_weights=None, classes=3, **widths), mode)()
    ours = getattr(builder(encoder, upsampler="interpolate", num_classes=3, **widths), mode)()
    return ours, reference


@pytest.mark.parametrize(
    "key", [pytest.param(k, marks=pytest.mark.slow) if k == "segformer-cnn" else k for k in DECODERS]
)
@pytest.mark.parametrize("mode", [pytest.param("eval", marks=pytest.mark.slow), "train"])
def test_with_smps_resize_it_is_smps_model(key, mode):
    ours, reference = _pair(key, mode)
    assert ours.load_state_dict(reference.state_dict(), strict=True)  # smp's keys, nothing more
    x = torch.randn(2, 3, 64, 96)
    expected, got = torch.manual_seed(1) and reference(x), torch.manual_seed(1) and ours(x)  # same dropout
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    weights = torch.randn_like(expected)
    (expected * weights).sum().backward()
    (got * weights).sum().backward()
    for (name, p), q in zip(reference.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)


def _cases():
    for key in ("fpn", "upernet", "segformer", "deeplabv3plus"):
        for block in BLOCKS_2D:
            marks = () if key == "fpn" else (pytest.mark.slow,)  # FPN has the most points
            yield pytest.param(key, block, id=f"{key}-{block}", marks=marks)


@pytest.mark.parametrize("key, block", _cases())
def test_every_block_at_every_point_runs_at_any_size_and_learns(key, block):
    builder, _, encoder, widths = DECODERS[key]
    torch.manual_seed(0)
    model = builder(encoder, upsampler=block, num_classes=3, **widths).train()
    out = model(torch.randn(2, 3, 70, 45))
    assert out.shape == (2, 3, 70, 45)
    (out * torch.randn_like(out)).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing[:5]
    learned = [n for n, _ in model.named_parameters() if ".up_" in n]
    assert bool(learned) == (describe_blocks(block)[0]["params"] > 0)  # parameter-free blocks learn nothing


@pytest.mark.parametrize(
    "key, counts",
    [
        ("fpn", {"top_down": [2] * 3, "branch": [2] * 6}),
        ("upernet", {"fpn": [2] * 3, "fuse": [8, 4, 2]}),
        ("segformer", {"stages": [8, 4, 2]}),
        pytest.param("segformer-cnn", {"stages": [8, 4, 2]}, marks=pytest.mark.slow),  # 1/2 is resized down
        pytest.param("deeplabv3plus", {"aspp": [4]}, marks=pytest.mark.slow),
    ],
)
def test_guided_blocks_get_the_encoder_feature_at_their_output_resolution(key, counts):
    builder, _, encoder, widths = DECODERS[key]
    model = builder(encoder, upsampler="fade", num_classes=3, **widths).eval()
    seen = []
    for point in counts:
        for block in getattr(model.decoder, f"up_{point}"):
            block.register_forward_hook(lambda m, args, out, point=point: seen.append((point, args, out)))
    model(torch.randn(1, 3, 64, 128))
    assert [(p, args[1].shape[-1] // args[0].shape[-1]) for p, args, _ in seen] == [
        (p, s) for p, scales in counts.items() for s in scales
    ]
    for _, (x, guide), out in seen:
        assert guide.shape[2:] == out.shape[2:] and out.shape[:2] == x.shape[:2]
    assert model.segmentation_head[1].mode == "bilinear"  # the head keeps smp's resize


def test_a_point_list_a_mapping_and_options_per_point():
    builder, _, encoder, widths = DECODERS["fpn"]
    model = builder(encoder, upsampler=["carafe", None, "transposed"], num_classes=3, **widths)
    assert type(model.decoder.up_top_down[0]).__name__ == "CarafeUpsampler"
    assert model.decoder.up_branch[0].mode == "bilinear" and model.decoder.up_branch[0].align_corners
    assert type(model.segmentation_head[1]).__name__ == "TransposedConvUpsampler"
    model = builder(
        encoder, upsampler={"top_down": "dysample"}, upsampler_options={"top_down": {"groups": 8}}, **widths
    )
    assert model.decoder.up_top_down[0].groups == 8 and model.decoder.up_top_down[0].in_channels == 32
    model = builder(encoder, upsampler_options={"branch": {"mode": "nearest"}}, **widths)  # interpolate with them
    assert model.decoder.up_branch[0].mode == "nearest" and model.decoder.up_top_down[0].mode == "nearest"


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"upsampler": {"head": "fade"}}, ConfigError, r"smp_fpn head 0: 'fade' is guided by the encoder skip"),
        ({"upsampler": {"hed": "carafe"}}, ConfigError, r"no point 'hed'; its points are top_down, branch, head"),
        ({"upsampler": ["carafe"]}, ConfigError, r"a list with one per point \(top_down, branch, head\)"),
        ({"upsampler": "nope"}, RegistryError, r"unknown upsampler 'nope'"),
        (
            {"upsampler": "transposed", "upsampler_options": {"kernel_size": 3}},
            ConfigError,
            r"maps size 5 to 11x11, the model needs exactly 10x10",
        ),
        ({"upsampler_options": {"top_down": {}, "mode": "x"}}, ConfigError, r"mixes point names \(top_down\)"),
        ({"upsampler_options": [1]}, ConfigError, r"upsampler_options: expected a mapping"),
        ({"encoder_weights": "imagenet"}, ConfigError, r"never downloads weights: got encoder_weights='imagenet'"),
        ({"upsampling": 2}, ConfigError, r"the head always upsamples the logits to the input size"),
        ({"input_policy": "crop"}, ConfigError, r"input_policy must be 'pad' or 'strict', got 'crop'"),
        ({"num_classes": 0}, ConfigError, r"classes"),
        ({"encoder_name": "resnet999"}, ConfigError, r"unknown encoder 'resnet999'; did you mean 'resnet50'\?"),
        ({"encoder_name": None}, ConfigError, r"unknown encoder None"),
        (
            {"encoder_depth": 2},
            ConfigError,
            r"smp refuses encoder_depth=2 with encoder .* \(ValueError: Encoder depth for FPN",
        ),
        ({"encoder_depth": "3"}, ConfigError, r"encoder_depth must be a whole number >= 1, got '3'"),
        (
            {"upsampler_options": {"mode": "nearest"}},
            ConfigError,
            r"apply to the blocks upsampler names, and it names none",
        ),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(kwargs, error, message):
    kwargs = {"encoder_name": "resnet18", **kwargs}
    with pytest.warns() if "kernel_size" in str(kwargs) else _nothing(), pytest.raises(error, match=message):
        smp_fpn(**kwargs)


@pytest.mark.parametrize("depth", [3, 4])
def test_a_shallower_fpn_still_returns_logits_at_the_input_size(depth):
    """smp's FPN upsamples its head x4 at any encoder depth (logits at 2x/4x the input for depth
    4/3); upzoo's ends the head at the input size: smp's model with ``upsampling=2**(depth-3)``."""
    torch.manual_seed(0)
    widths = DECODERS["fpn"][3]
    reference = smp.FPN("resnet18", encoder_weights=None, encoder_depth=depth, upsampling=2 ** (depth - 3), **widths)
    ours = smp_fpn("resnet18", encoder_depth=depth, **widths)
    ours.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(1, 3, 64, 96)
    # exact: the same modules run the same ops on the same input (64x96 needs no padding); checked
    # with ATEN_CPU_CAPABILITY=default/avx2 and OMP_NUM_THREADS=1
    torch.testing.assert_close(ours.eval()(x), reference.eval()(x), rtol=0, atol=0)
    assert ours(x).shape[2:] == (64, 96)
    assert smp_fpn("resnet18", encoder_depth=depth, upsampler="pixel_shuffle", **widths).eval()(x).shape[2:] == (64, 96)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("key, stride", [("fpn", 32), ("segformer", 32), ("deeplabv3plus", 16)])
def test_size_rule_strict_policy_and_the_shape_solver_agree(key, stride):
    builder, _, encoder, widths = DECODERS[key]
    model = builder(encoder, num_classes=2, input_policy="strict", **widths).eval()
    solver = ShapeSolver(model)
    assert solver.path == "analytic" and solver.rule(0).describe() == f"multiples of {stride}"
    assert model(torch.randn(1, 3, stride, 2 * stride)).shape == (1, 2, stride, 2 * stride)
    hint = rf"nearest valid sizes: axis 1: {2 * stride + 1} -> {2 * stride} or {3 * stride}"
    with pytest.raises(ShapeError, match=hint):
        model(torch.randn(1, 3, stride, 2 * stride + 1))


def test_recipes_build_every_decoder_and_upzoo_list_names_their_points():
    for architecture in DECODER_POINTS:
        spec = ModelSpec.from_dict(
            {"architecture": architecture, "encoder_name": "resnet18", "num_classes": 4, "upsampler": "dysample"}
        )
        assert build_model(spec)(torch.randn(2, 3, 32, 32)).shape == (2, 4, 32, 32)
    from upzoo.models.smp_decoders import decoder_point_rows

    rows = decoder_point_rows()  # what `upzoo list --decoders` prints
    assert [(r["decoder"], r["point"]) for r in rows][:3] == [
        ("smp_fpn", "top_down"), ("smp_fpn", "branch"), ("smp_fpn", "head")
    ]  # fmt: skip
    heads = [r for r in rows if r["point"] == "head"]
    assert len(heads) == 4 and all("fade" not in r["accepts"] and "dysample" in r["accepts"] for r in heads)
    spec = {"architecture": "smp_fpn", "encoder_name": "resnet18", "upsampler_option": {}}
    with pytest.raises(ConfigError, match=r"smp_fpn: unknown option 'upsampler_option' \(smp's FPN would ignore it"):
        build_model(spec)
    with pytest.raises(
        ConfigError, match=r"smp_unet: unknown option 'decoder_channel'.*did you mean 'decoder_channels'"
    ):
        build_model({"architecture": "smp_unet", "encoder_name": "resnet18", "decoder_channel": [8]})


@pytest.mark.parametrize("builder", [smp_upernet, smp_deeplabv3plus])
def test_a_training_batch_of_one_is_refused_where_batchnorm_follows_global_pooling(builder):
    model = builder("resnet18", num_classes=2)
    with pytest.raises(ShapeError, match=r"training needs batches of 2 or more, got 1; set data.batch_size >= 2"):
        model(torch.randn(1, 3, 64, 64))
    assert model.eval()(torch.randn(1, 3, 64, 64)).shape == (1, 2, 64, 64)


@pytest.mark.slow  # a training, an ONNX export checked at three sizes
def test_a_trained_decoder_run_predicts_and_exports_verified(tmp_path):
    """Train (one step), predict, and export to ONNX: the deployment with onnxruntime alone gives
    upzoo's predictions on a held-out scene of another size than the training crops."""
    ort = pytest.importorskip("onnxruntime")
    from conftest import small_recipe
    from upzoo.inference import Predictor, load_model
    from upzoo.inference.export import export_model
    from upzoo.recipe import parse_recipe
    from upzoo.train.engine import train

    recipe = small_recipe(tmp_path / "cache")
    recipe["model"] = {"architecture": "smp_segformer", "encoder_name": "mit_b0", "num_classes": 19,
                       "decoder_segmentation_channels": 32, "upsampler": "dysample"}  # fmt: skip
    train(parse_recipe(recipe), tmp_path / "run", progress=False)
    loaded = load_model(tmp_path / "run")
    report = export_model(loaded, "onnx", tmp_path / "model.onnx")
    assert all(check["ok"] for check in report["checks"])
    image = sorted((tmp_path / "cache").rglob("leftImg8bit/val/**/*.png"))[0]
    expected = Predictor(loaded, window="off").predict(str(image)).labels
    session = ort.InferenceSession(report["path"], providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    mean, std = (
        np.array(json.loads(meta["input.mean"]), np.float32),
        np.array(json.loads(meta["input.std"]), np.float32),
    )
    pixels = (np.asarray(Image.open(image).convert("RGB"), dtype=np.float32) / 255.0 - mean) / std
    logits = session.run(None, {"input": pixels.transpose(2, 0, 1)[None].astype(np.float32)})[0]
    assert expected.shape == (32, 64) and (logits[0].argmax(axis=0) == expected).mean() >= 0.999


@pytest.mark.parametrize("size, spatial", [(6, (3, 2)), (3, (13, 4))])
def test_upernets_pyramid_pooling_traced_pools_right_at_every_size(size, spatial):
    """Exporters specialise adaptive pooling windows to the example's size; traced, upzoo's PPM pools
    with bin matrices built from the size instead, equal to PyTorch's pooling."""
    from upzoo.models.smp_decoders import AdaptiveAvgPool2d

    torch._dynamo.reset()
    pooled = torch.compile(AdaptiveAvgPool2d(size), fullgraph=True, backend="aot_eager", dynamic=True)
    for shape in [spatial, (spatial[0] + 3, spatial[1] + 5)]:
        x = torch.randn(2, 3, *shape, dtype=torch.float64)
        torch.testing.assert_close(pooled(x), torch.nn.functional.adaptive_avg_pool2d(x, size), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "builder, widths",
    [(smp_unet, {"encoder_depth": 3, "decoder_channels": (16, 8, 4)}), (smp_fpn, {"decoder_pyramid_channels": 16})],
)
def test_num_classes_is_the_name_and_classes_still_works_for_a_release(builder, widths):
    """As UNet: ``num_classes``. smp's ``classes`` builds the same model with a FutureWarning; the two
    with different values are refused."""
    torch.manual_seed(0)
    model = builder("resnet18", num_classes=3, **widths)
    torch.manual_seed(0)
    with pytest.warns(FutureWarning, match=r"classes= is deprecated and will be removed; use num_classes="):
        old = builder("resnet18", classes=3, **widths)
    state, old_state = model.state_dict(), old.state_dict()
    assert state.keys() == old_state.keys() and all(torch.equal(state[k], old_state[k]) for k in state)
    assert model.segmentation_head[0].out_channels == 3
    with pytest.raises(ConfigError, match=r"num_classes=3 and classes=4 differ; give num_classes alone"):
        builder("resnet18", num_classes=3, classes=4)


@pytest.mark.parametrize("builder", [smp_unet, smp_fpn])
def test_smp_models_pickle_and_deepcopy(builder):
    """torch.save(model), copy.deepcopy and multiprocessing pickle the model; its class is made at
    run time (smp's class with upzoo's input policy), so it rebuilds itself by name."""
    import copy
    import pickle

    model = builder("resnet18", num_classes=2).eval()
    x = torch.randn(1, 3, 40, 56)  # not a multiple of 32: the padding policy is part of what must survive
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert type(clone) is type(model) and clone.input_policy == "pad"
        torch.testing.assert_close(clone(x), model(x), rtol=0, atol=0)  # the same weights, the same ops
