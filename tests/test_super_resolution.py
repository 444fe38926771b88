"""Super-resolution: the degradation, the metrics and their references, the networks, the data."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from upzoo.data.bicubic import bicubic_downscale, imresize, resize_matrix
from upzoo.errors import ConfigError, DataError, ShapeError
from upzoo.metrics import ImageQuality, psnr, rgb_to_y, ssim
from upzoo.models import EDSR, ESPCN, RRDBNet

# -- references ported from BasicSR (Apache-2.0), basicsr/utils/matlab_functions.py and
# basicsr/metrics/psnr_ssim.py, metric_util.py, utils/color_util.py: their definitions, re-typed ----


def _basicsr_weights(in_length, out_length, scale, kernel_width=4.0):
    def cubic(x):
        ax = torch.abs(x)
        return (1.5 * ax**3 - 2.5 * ax**2 + 1) * (ax <= 1).type_as(ax) + (-0.5 * ax**3 + 2.5 * ax**2 - 4 * ax + 2) * (
            (ax > 1) * (ax <= 2)
        ).type_as(ax)

    if scale < 1:
        kernel_width = kernel_width / scale
    x = torch.linspace(1, out_length, out_length)
    u = x / scale + 0.5 * (1 - 1 / scale)
    left = torch.floor(u - kernel_width / 2)
    p = math.ceil(kernel_width) + 2
    indices = left.view(out_length, 1).expand(out_length, p) + torch.linspace(0, p - 1, p).view(1, p)
    distance = u.view(out_length, 1) - indices
    weights = scale * cubic(distance * scale) if scale < 1 else cubic(distance)
    weights = weights / weights.sum(1, keepdim=True)
    zeros = torch.sum(weights == 0, 0)
    if not math.isclose(zeros[0], 0, rel_tol=1e-6):
        indices, weights = indices.narrow(1, 1, p - 2), weights.narrow(1, 1, p - 2)
    if not math.isclose(zeros[-1], 0, rel_tol=1e-6):
        indices, weights = indices.narrow(1, 0, p - 2), weights.narrow(1, 0, p - 2)
    sym_s, sym_e = -indices.min() + 1, indices.max() - in_length
    return weights.contiguous(), (indices + sym_s - 1).contiguous(), int(sym_s), int(sym_e)


def _basicsr_resize_axis(img, axis, out_length, scale):
    """One axis of BasicSR's ``imresize`` (symmetric copy, then one weighted sum per output)."""
    img = img.movedim(axis, 1)
    c, n, m = img.shape
    weights, indices, sym_s, sym_e = _basicsr_weights(n, out_length, scale)
    aug = torch.zeros(c, n + sym_s + sym_e, m)
    aug.narrow(1, sym_s, n).copy_(img)
    aug.narrow(1, 0, sym_s).copy_(img[:, :sym_s].flip(1))
    aug.narrow(1, sym_s + n, sym_e).copy_(img[:, -sym_e:].flip(1))
    out = torch.zeros(c, out_length, m)
    width = weights.size(1)
    for i in range(out_length):
        idx = int(indices[i][0])
        for j in range(c):
            out[j, i, :] = aug[j, idx : idx + width, :].transpose(0, 1).mv(weights[i])
    return out.movedim(1, axis)


def basicsr_imresize(img: torch.Tensor, scale: float) -> torch.Tensor:
    """BasicSR's ``imresize(img (C, H, W) in [0, 1], scale)`` (float32, as theirs)."""
    _, h, w = img.shape
    out = _basicsr_resize_axis(img.float(), 1, math.ceil(h * scale), scale)
    return _basicsr_resize_axis(out, 2, math.ceil(w * scale), scale)


def basicsr_to_y(img_bgr_255: np.ndarray) -> np.ndarray:
    img = img_bgr_255.astype(np.float32) / 255.0
    y = np.dot(img, [24.966, 128.553, 65.481]) + 16.0
    return ((y / 255.0).astype(np.float32) * 255.0)[..., None]


def _basicsr_crop_and_y(img, img2, crop_border, test_y_channel):
    if crop_border:
        img, img2 = (
            img[crop_border:-crop_border, crop_border:-crop_border],
            img2[crop_border:-crop_border, crop_border:-crop_border],
        )
    if test_y_channel:
        img, img2 = basicsr_to_y(img), basicsr_to_y(img2)
    return img, img2


def basicsr_psnr(img, img2, crop_border, test_y_channel=False):
    img, img2 = _basicsr_crop_and_y(img, img2, crop_border, test_y_channel)
    mse = np.mean((img.astype(np.float64) - img2.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0 * 255.0 / mse)


def _basicsr_ssim_channel(img, img2):
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    kernel = cv2.getGaussianKernel(11, 1.5)
    window = np.outer(kernel, kernel.transpose())
    mu1 = cv2.filter2D(img, -1, window)[5:-5, 5:-5]
    mu2 = cv2.filter2D(img2, -1, window)[5:-5, 5:-5]
    s1 = cv2.filter2D(img**2, -1, window)[5:-5, 5:-5] - mu1**2
    s2 = cv2.filter2D(img2**2, -1, window)[5:-5, 5:-5] - mu2**2
    s12 = cv2.filter2D(img * img2, -1, window)[5:-5, 5:-5] - mu1 * mu2
    return (((2 * mu1 * mu2 + c1) * (2 * s12 + c2)) / ((mu1**2 + mu2**2 + c1) * (s1 + s2 + c2))).mean()


def basicsr_ssim(img, img2, crop_border, test_y_channel=False):
    img, img2 = _basicsr_crop_and_y(img, img2, crop_border, test_y_channel)
    img, img2 = img.astype(np.float64), img2.astype(np.float64)
    return float(np.mean([_basicsr_ssim_channel(img[..., i], img2[..., i]) for i in range(img.shape[2])]))


def _photo_like(seed: int, shape=(3, 60, 84)) -> torch.Tensor:
    """Smooth structure plus texture, in [0, 1]: closer to a photograph than white noise."""
    g = torch.Generator().manual_seed(seed)
    coarse = F.interpolate(torch.rand(1, shape[0], shape[1] // 6, shape[2] // 6, generator=g), size=shape[1:],
                           mode="bicubic", align_corners=False)[0]  # fmt: skip
    return (0.8 * coarse + 0.2 * torch.rand(shape, generator=g)).clamp(0, 1)


# -- the degradation ----------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [2, 3, 4])
def test_downscale_equals_basicsr_imresize(scale):
    image = _photo_like(scale, (3, 24 * scale, 20 * scale))
    ours = bicubic_downscale(image, scale)
    reference = basicsr_imresize(image, 1 / scale)
    assert ours.shape == reference.shape == (3, 24, 20)
    assert (ours - reference).abs().max() < 1e-4


@pytest.mark.parametrize("scale", [2, 3, 4])
def test_upscale_equals_basicsr_imresize(scale):
    image = _photo_like(10 + scale, (3, 17, 23))
    ours = imresize(image, (17 * scale, 23 * scale), float(scale))
    assert (ours - basicsr_imresize(image, scale)).abs().max() < 1e-4


def matlab_contributions(in_length: int, out_length: int, scale: float) -> np.ndarray:
    """MATLAB's ``imresize`` weights along one axis, one output sample at a time, from its
    ``contributions`` function: Keys' cubic (a = -0.5) widened by 1 / scale when shrinking, ``left =
    floor(u - width / 2)``, ``ceil(width) + 2`` taps, rows normalised, then the indices mapped through
    ``aux = [1:n, n:-1:1]`` with ``mod``: a periodic mirror, also for kernels wider than the image."""

    def cubic(x: float) -> float:
        a = abs(x)
        return (1.5 * a**3 - 2.5 * a**2 + 1) * (a <= 1) + (-0.5 * a**3 + 2.5 * a**2 - 4 * a + 2) * (1 < a <= 2)

    width = 4 / scale if scale < 1 else 4.0
    aux = list(range(1, in_length + 1)) + list(range(in_length, 0, -1))
    matrix = np.zeros((out_length, in_length))
    for x in range(1, out_length + 1):
        u = x / scale + 0.5 * (1 - 1 / scale)
        taps = [math.floor(u - width / 2) + p for p in range(math.ceil(width) + 2)]
        weights = [scale * cubic(scale * (u - j)) if scale < 1 else cubic(u - j) for j in taps]
        for j, w in zip(taps, weights):
            matrix[x - 1, aux[(j - 1) % len(aux)] - 1] += w / sum(weights)
    return matrix


@pytest.mark.parametrize(
    "in_length, out_length, scale",
    [(8, 1, 1 / 8), (4, 1, 1 / 4), (3, 1, 1 / 3), (6, 2, 1 / 3), (12, 3, 1 / 4), (5, 10, 2.0)],
)
def test_the_resize_matrix_is_matlabs_also_for_kernels_wider_than_the_image(in_length, out_length, scale):
    np.testing.assert_allclose(resize_matrix(in_length, out_length, scale).numpy(),
                               matlab_contributions(in_length, out_length, scale), atol=1e-12)  # fmt: skip
    image = _photo_like(1, (1, 8, 8)).double()
    expected = matlab_contributions(8, 1, 1 / 8) @ image[0].numpy() @ matlab_contributions(8, 1, 1 / 8).T
    assert bicubic_downscale(image, 8)[0].numpy() == pytest.approx(expected, abs=1e-12)


def test_downscale_equals_torch_antialiased_bicubic_inside_the_image():
    """An independent implementation of the same kernel: equal away from the edges, where PyTorch
    renormalises instead of mirroring."""
    image = _photo_like(3, (1, 64, 64)).double()
    ours = bicubic_downscale(image, 4)
    torch_ = F.interpolate(image[None], scale_factor=0.25, mode="bicubic", antialias=True, align_corners=False)[0]
    inside = (slice(None), slice(2, -2), slice(2, -2))
    assert (ours[inside] - torch_[inside]).abs().max() < 1e-9
    assert (ours - torch_).abs().max() > 1e-4  # the edges differ: a test that could tell them apart


def test_resize_matrix_rows_sum_to_one_and_bad_sizes_are_refused():
    assert torch.allclose(resize_matrix(30, 10, 1 / 3).sum(1), torch.ones(10, dtype=torch.float64))
    with pytest.raises(ShapeError, match="not a multiple of 4; crop it first"):
        bicubic_downscale(torch.rand(3, 10, 12), 4)
    with pytest.raises(ShapeError, match="expected float images"):
        imresize(torch.zeros(3, 8, 8, dtype=torch.uint8), (4, 4), 0.5)
    with pytest.raises(ConfigError, match="factor must be a whole number >= 1, got 0"):
        bicubic_downscale(torch.rand(3, 8, 8), 0)
    with pytest.raises(ConfigError, match="scale must be a positive finite number"):
        imresize(torch.rand(3, 8, 8), (4, 4), -0.5)
    with pytest.raises(ShapeError, match="imresize size"):
        imresize(torch.rand(3, 8, 8), (4, 0), 0.5)


# -- the metrics --------------------------------------------------------------------------------


@pytest.mark.parametrize("y_channel", [True, False])
@pytest.mark.parametrize("crop", [0, 2, 4])
def test_psnr_and_ssim_equal_basicsr(y_channel, crop):
    g = torch.Generator().manual_seed(crop)
    target = torch.round(_photo_like(crop, (3, 48, 56)) * 255) / 255
    output = torch.round((target + 0.03 * torch.randn(target.shape, generator=g)).clamp(0, 1) * 255) / 255
    bgr = [np.ascontiguousarray((t.permute(1, 2, 0).numpy() * 255).round()[..., ::-1]) for t in (output, target)]
    ours_psnr = float(psnr(output[None], target[None], crop_border=crop, y_channel=y_channel)[0])
    ours_ssim = float(ssim(output[None], target[None], crop_border=crop, y_channel=y_channel)[0])
    assert abs(ours_psnr - basicsr_psnr(*bgr, crop, y_channel)) < 1e-6
    assert abs(ours_ssim - basicsr_ssim(*bgr, crop, y_channel)) < 1e-6


def test_y_channel_and_psnr_facts():
    white, black = torch.ones(1, 3, 16, 16), torch.zeros(1, 3, 16, 16)
    assert torch.allclose(rgb_to_y(white), torch.full((1, 1, 16, 16), 235.0, dtype=torch.float64), atol=1e-4)
    assert torch.allclose(rgb_to_y(black), torch.full((1, 1, 16, 16), 16.0, dtype=torch.float64))
    assert psnr(white, white)[0] == math.inf
    x = _photo_like(0, (3, 32, 32))[None]
    assert float(psnr(x, (x + 0.1).clamp(0, 1))[0]) == pytest.approx(
        10 * math.log10(1 / F.mse_loss(x.double(), (x + 0.1).clamp(0, 1).double()).item()), abs=1e-9
    )


def test_image_quality_streams_the_mean_of_per_image_values():
    a, b = _photo_like(1, (3, 40, 40))[None], _photo_like(2, (3, 40, 40))[None]
    c, d = _photo_like(3, (3, 30, 50))[None], _photo_like(4, (3, 30, 50))[None]
    metric = ImageQuality(crop_border=3, y_channel=True)
    metric.update(a, b)
    metric.update(c, d)
    expected = (
        float(psnr(a, b, crop_border=3, y_channel=True)[0]) + float(psnr(c, d, crop_border=3, y_channel=True)[0])
    ) / 2
    assert metric.compute()["psnr"] == pytest.approx(expected, abs=1e-12)
    assert metric.compute()["images"] == 2
    each = [float(psnr(x, y, crop_border=3, y_channel=True)[0]) for x, y in ((a, b), (c, d))]
    assert metric.per_image()[0] == pytest.approx(each, abs=1e-12)
    default = ImageQuality()  # the functions' defaults: RGB, no border
    empty = default.compute()  # documented: NaN means over no image, and the count says why
    assert math.isnan(empty["psnr"]) and math.isnan(empty["ssim"]) and empty["images"] == 0
    default.update(a, b)
    assert default.compute()["psnr"] == pytest.approx(float(psnr(a, b)[0]), abs=1e-12)
    assert default.compute()["ssim"] == pytest.approx(float(ssim(a, b)[0]), abs=1e-12)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x: psnr(x * 255, x), r"image quality: output must be in \[0, 1\], got values in \[0, 2\d\d"),
        (lambda x: ssim(x, x * 2 - 1), r"image quality: target must be in \[0, 1\], got values in \[-1"),
        (lambda x: psnr(x, x, y_channel="no"), "y_channel must be True or False, got 'no'"),
        (lambda x: ImageQuality(y_channel="yes"), "y_channel must be True or False, got 'yes'"),
    ],
)
def test_image_quality_refuses_other_ranges_and_flags_in_one_line(call, message):
    with pytest.raises(ConfigError, match=message):
        call(_photo_like(5, (3, 32, 32))[None])


@pytest.mark.parametrize(
    ("output", "target", "options", "error", "message"),
    [
        (torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 18), {}, ShapeError, "differ"),
        (
            torch.rand(3, 16, 16),
            torch.rand(3, 16, 16),
            {},
            ShapeError,
            r"images \(B, C, H, W\), got shape \(3, 16, 16\)",
        ),
        (torch.ones(1, 3, 16, 16, dtype=torch.uint8), torch.rand(1, 3, 16, 16), {}, ConfigError, "float images"),
        (torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16), {"crop_border": 4}, ShapeError, "less than 11 pixels"),
        (torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16), {"crop_border": -1}, ConfigError, "crop_border must be"),
        (torch.rand(1, 2, 16, 16), torch.rand(1, 2, 16, 16), {"y_channel": True}, ShapeError, "RGB or gray"),
        (torch.full((1, 3, 16, 16), math.nan), torch.rand(1, 3, 16, 16), {}, ConfigError, "NaN"),
    ],
)
def test_bad_metric_inputs_are_one_line(output, target, options, error, message):
    with pytest.raises(error, match=message):
        psnr(output, target, **options)


# -- the networks -------------------------------------------------------------------------------

BLOCKS = ["pixel_shuffle", "interp_conv", "transposed", "dysample", "carafe", "fir"]


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("scale", [2, 3, 4])
def test_networks_take_any_block_at_any_scale(block, scale):
    small = {"channels": 8, "num_blocks": 1}
    for net in (
        ESPCN(scale=scale, upsampler=block, channels=(8, 8)),
        EDSR(scale=scale, upsampler=block, **small),
        RRDBNet(scale=scale, upsampler=block, growth=4, **small),
    ):
        x = torch.rand(2, 3, 11, 13)
        y = net(x)
        assert y.shape == net.output_shape(tuple(x.shape)) == (2, 3, 11 * scale, 13 * scale)
        y.mean().backward()
        assert all(p.grad is not None for p in net.parameters())


def test_tail_stages_count_and_the_defaults_of_the_papers():
    edsr = EDSR(scale=4, channels=8, num_blocks=1)
    assert [type(m).__name__ for m in edsr.tail] == ["PixelShuffleUpsampler"] * 2
    assert [m.scale for m in EDSR(scale=3, channels=8, num_blocks=1).tail] == [(3, 3)]
    assert [type(m).__name__ for m in RRDBNet(scale=4, channels=8, num_blocks=1).tail][::2] == [
        "InterpConvUpsampler"
    ] * 2
    assert len(ESPCN(scale=4).tail) == 1


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ESPCN(scale=5), "scale must be one of 2, 3, 4, 8, got 5"),
        (lambda: EDSR(scale=3, tail="stages"), "not a power of two"),
        (lambda: EDSR(scale=2, tail="some"), "tail must be"),
        (lambda: EDSR(scale=2, res_scale=0), r"res_scale must be a number in \(0, 1\]"),
        (lambda: ESPCN(scale=2, upsampler="sapa"), "guide"),
        (lambda: ESPCN(scale=2, upsampler_options={"scale": 2}), "sets scale"),
        (lambda: RRDBNet(scale=2, channels=0), "RRDBNet channels must be a whole number >= 1"),
    ],
)
def test_bad_network_arguments_are_one_line(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_network_refuses_other_channels():
    with pytest.raises(ShapeError, match="expects 3 input channels"):
        ESPCN(scale=2)(torch.rand(1, 1, 8, 8))


# -- the package photographs ---------------------------------------------------------------------


def test_package_images_are_found_by_name_and_refused_in_one_line(monkeypatch):
    pytest.importorskip("skimage")
    from upzoo.data import package_images as pi

    image = pi.read_package_image("astronaut")
    assert image.shape == (512, 512, 3) and image.dtype == np.uint8
    assert pi.read_package_image("camera").shape == (512, 512, 3)  # grayscale, read as RGB
    with pytest.raises(DataError, match="no package image 'astronot'.*did you mean 'astronaut'"):
        pi.package_image_path("astronot")
    monkeypatch.setattr(pi.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="ships with scikit-image, which is not installed; pip install scikit-image"):
        pi.package_image_path("astronaut")


def test_train_and_held_out_photographs_do_not_overlap():
    from upzoo.data.package_images import PACKAGE_IMAGES, PACKAGE_TEST, PACKAGE_TRAIN

    assert not set(PACKAGE_TEST) & set(PACKAGE_TRAIN)
    assert set(PACKAGE_TEST) | set(PACKAGE_TRAIN) <= set(PACKAGE_IMAGES)


def test_training_pairs_depend_only_on_seed_epoch_and_index():
    pytest.importorskip("skimage")
    from upzoo.data.package_images import package_image_path
    from upzoo.data.super_resolution import SuperResolutionPatches

    data = SuperResolutionPatches([package_image_path("chelsea")], 3, 3, (48, 48), patches_per_image=4)
    first = data[2]
    assert first["image"].shape == (3, 16, 16) and first["target"].shape == (3, 48, 48)
    assert torch.equal(data[2]["target"], first["target"]) and not torch.equal(data[1]["target"], first["target"])
    assert torch.equal(first["image"], torch.round(first["image"] * 255) / 255)  # 8-bit, as the papers' PNGs
    data.epoch = 1
    assert not torch.equal(data[2]["target"], first["target"])


def _augmented(patch: torch.Tensor, flip_w: bool, flip_h: bool, transpose: bool) -> torch.Tensor:
    patch = patch.flip([2]) if flip_w else patch
    patch = patch.flip([1]) if flip_h else patch
    return patch.transpose(1, 2) if transpose else patch


def test_training_pairs_are_paired_crops_of_the_degraded_whole_image():
    """BasicSR's paired_random_crop: the low-resolution crop is cut from the whole image's
    degradation at the same place as the high-resolution crop (not the crop degraded on its own,
    whose mirrored borders differ), and both get the same flips and rotation."""
    pytest.importorskip("skimage")
    import itertools

    from upzoo.data.io import read_image
    from upzoo.data.package_images import package_image_path
    from upzoo.data.super_resolution import SuperResolutionPatches, degrade, mod_crop

    path, scale, crop = package_image_path("chelsea"), 4, 48
    whole = torch.from_numpy(mod_crop(read_image(path, channels=3), scale).copy()).permute(2, 0, 1).float() / 255
    low = degrade(whole, scale)
    data = SuperResolutionPatches([path], scale, 3, (crop, crop), patches_per_image=6)
    own_borders = []
    for item in (data[i] for i in range(6)):
        found = []
        corners = whole[:, : whole.shape[1] - crop + 1 : scale, : whole.shape[2] - crop + 1 : scale]
        for flips in itertools.product((False, True), repeat=3):
            undone = item["target"]  # undo the flips in reverse order: each is its own inverse
            undone = undone.transpose(1, 2) if flips[2] else undone
            undone = undone.flip([1]) if flips[1] else undone
            undone = undone.flip([2]) if flips[0] else undone
            for t, l in (corners == undone[:, :1, :1]).all(0).nonzero().tolist():  # candidates by one pixel
                top, left = t * scale, l * scale
                if torch.equal(whole[:, top : top + crop, left : left + crop], undone):
                    found.append((flips, t, l))
        assert found, "the target is a crop of the image"
        flips, top, left = found[0]
        assert torch.equal(
            item["image"], _augmented(low[:, top : top + crop // scale, left : left + crop // scale], *flips)
        )
        own_borders.append(float((degrade(item["target"], scale) != item["image"]).float().mean()))
    assert max(own_borders) > 0.05  # a crop degraded on its own differs: the pairing is what the test checks


def test_imresize_refuses_a_size_that_contradicts_its_scale_and_nan_pixels():
    image = _photo_like(6, (3, 24, 36))
    with pytest.raises(ShapeError, match=r"size \(10, 18\) contradicts scale 0.5 for a 24x36 image .*\(12, 18\)"):
        imresize(image, (10, 18), 0.5)
    assert imresize(image, (12, 18), 0.5).shape == (3, 12, 18)
    assert bicubic_downscale(_photo_like(7, (3, 48, 45)), 3).shape == (3, 16, 15)  # 1/3 scales to whole sizes
    image[0, 0, 0] = float("nan")
    with pytest.raises(ConfigError, match=r"imresize: images: 1 of 2592 values are NaN"):
        imresize(image, (12, 18), 0.5)
