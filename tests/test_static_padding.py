"""TF "same" padding (timm's Conv2dSame) made static for export: equal to timm's on inputs that are
a multiple of the stride (what upzoo's encoders give every strided convolution), and a pretrained
EfficientNet-Lite FPN exports, verified against the model itself, instead of tracing for minutes."""

from __future__ import annotations

import pytest
import torch
from timm.layers import create_conv2d

from upzoo.inference.static_padding import StaticSameConv2d, with_static_same_padding
from upzoo.models import build_model


@pytest.mark.parametrize("kernel, stride, dilation", [(3, 2, 1), (5, 2, 1), (3, 2, 2), (4, 2, 1), (3, 1, 1)])
def test_static_padding_equals_tf_same_padding_on_multiples_of_the_stride(kernel, stride, dilation):
    torch.manual_seed(0)
    conv = create_conv2d(4, 6, kernel, stride=stride, dilation=dilation, padding="same")
    static = StaticSameConv2d(conv) if type(conv).__name__ == "Conv2dSame" else None
    if static is None:  # stride 1: timm pads symmetrically and statically itself
        assert stride == 1 and type(conv) is torch.nn.Conv2d
        return
    for size in ((8, 12), (14, 6), (32, 32)):
        x = torch.randn(2, 4, *size)
        assert torch.equal(static(x), conv(x))
    odd = torch.randn(1, 4, 9, 9)  # outside the precondition TF pads one more: why only upzoo's sizes are verified
    assert static(odd).shape != conv(odd).shape or not torch.equal(static(odd), conv(odd))


@pytest.mark.slow  # about 25 s alone: ONNX-free, but torch.export of a whole FPN
def test_a_pretrained_lite_fpn_exports_and_is_verified_against_the_model(tmp_path):
    from upzoo.inference.export import export_model
    from upzoo.recipe import parse_recipe
    from upzoo.runs.trained_model import LoadedModel

    spec = {"architecture": "smp_fpn", "encoder_name": "tu-tf_efficientnet_lite0", "encoder_weights": "imagenet-lite",
            "num_classes": 4, "in_channels": 3}  # fmt: skip
    model = build_model(spec).eval()
    static = with_static_same_padding(model)
    assert sum(isinstance(m, StaticSameConv2d) for m in static.modules()) == 5
    assert static is not model and with_static_same_padding(static) is static
    assert sum(type(m).__name__ == "Conv2dSame" for m in model.modules()) == 5  # the model itself is untouched
    recipe = parse_recipe({"model": spec, "data": {"crop_size": [64, 96]}})
    loaded = LoadedModel(model, recipe, recipe.model, tmp_path / "best.pt", None, None, None, None, None)
    report = export_model(loaded, "exported-program", tmp_path / "m.pt2")
    assert [c["ok"] for c in report["checks"]] == [True, True, True]
    assert [c["input"] for c in report["checks"]][1] != [c["input"] for c in report["checks"]][0]  # off the grid too
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    x = torch.randn(1, 3, 65, 97)
    with torch.no_grad():
        assert (program(x) - model(x)).abs().max() < 1e-4
