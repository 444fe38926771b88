"""HD95 and surface Dice against MONAI; the boundary F-score against a definition written here with
scipy; their NaN conventions, streaming sums and errors."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from upzoo.errors import ConfigError, ShapeError
from upzoo.metrics import (
    BoundaryFScore,
    SurfaceMetrics,
    boundary_fscore,
    boundary_iou,
    hausdorff95,
    mean_iou,
    surface_dice,
    surface_metrics,
)

monai_metrics = pytest.importorskip("monai.metrics")


def _blobs(shape, num_classes, seed):
    """Label volumes of overlapping ellipsoids: a reference and a perturbed prediction."""
    rng = np.random.default_rng(seed)
    grids = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")

    def volume(jitter: float) -> np.ndarray:
        labels = np.zeros(shape, dtype=np.int64)
        for c in range(1, num_classes):
            centre = rng.uniform(0.3, 0.7, len(shape)) * np.array(shape)
            radii = rng.uniform(0.12, 0.3, len(shape)) * np.array(shape) * (1 + jitter * rng.normal())
            inside = sum(((g - m) / r) ** 2 for g, m, r in zip(grids, centre, radii)) <= 1
            labels[inside] = c
        return labels

    state = rng.bit_generator.state
    target = volume(0.0)
    rng.bit_generator.state = state
    return volume(0.15), target


def _one_hot(labels: np.ndarray, num_classes: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.from_numpy(labels), num_classes).movedim(-1, 0)[None].float()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("spacing", [(1.0, 1.0, 1.0), (3.0, 0.8, 0.7)])
def test_hd95_and_surface_dice_equal_monai(seed, spacing):
    pred, target = _blobs((20, 28, 24), 4, seed)
    ours_hd = hausdorff95(pred, target, 4, spacing=spacing)
    ours_nsd = surface_dice(pred, target, 4, spacing=spacing, tolerance_mm=2.0)
    p, t = _one_hot(pred, 4), _one_hot(target, 4)
    monai_hd = monai_metrics.compute_hausdorff_distance(p, t, include_background=True, percentile=95, spacing=spacing)
    monai_nsd = monai_metrics.compute_surface_dice(p, t, [2.0] * 4, include_background=True, spacing=spacing)
    np.testing.assert_allclose(ours_hd.numpy(), monai_hd[0].double().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours_nsd.numpy(), monai_nsd[0].double().numpy(), rtol=1e-6, atol=1e-6)


def test_absent_classes_follow_the_miou_convention():
    target = np.zeros((8, 8, 8), dtype=np.int64)
    target[2:5, 2:5, 2:5] = 1
    pred = target.copy()
    pred[6:8, 6:8, 6:8] = 2  # class 2 only in the prediction; class 3 in neither
    hd = hausdorff95(pred, target, 4, spacing=(1, 1, 1))
    nsd = surface_dice(pred, target, 4, spacing=(1, 1, 1), tolerance_mm=1.0)
    assert hd[1] == 0 and math.isinf(hd[2]) and math.isnan(hd[3])
    assert nsd[1] == 1 and nsd[2] == 0 and math.isnan(nsd[3])


def test_streaming_surface_metrics_average_the_cases():
    acc = SurfaceMetrics(3, tolerance_mm=1.5)
    cases = [_blobs((12, 16, 16), 3, seed) for seed in range(3)]
    for pred, target in cases:
        acc.update(torch.from_numpy(pred), torch.from_numpy(target), (2.0, 1.0, 1.0))
    result = acc.compute()
    expected = np.mean([hausdorff95(p, t, 3, spacing=(2.0, 1.0, 1.0)).numpy() for p, t in cases], axis=0)
    np.testing.assert_allclose(result["per_class_hd95"], expected)
    assert result["hd95"] == pytest.approx(expected[1:].mean())


@pytest.mark.parametrize(
    "path, volumes",
    [
        pytest.param("kd_tree", 200, marks=pytest.mark.slow),
        pytest.param("distance_transform", 200, marks=pytest.mark.slow),
        ("distance_transform", 50),
    ],
)
def test_both_paths_agree_with_monai_at_exact_ties_and_on_random_volumes(path, volumes, monkeypatch):
    """A distance equal to the tolerance counts (MONAI's ``<=``) on both code paths: plates k voxels
    apart at spacings where k * s is the tolerance, then random and constructed volumes (200 in the
    slow run, 50 by default)."""
    import upzoo.metrics.surface as surface

    monkeypatch.setattr(surface, "SPARSE_FACTOR", 0 if path == "kd_tree" else 10**9)
    cases = []
    for spacing, gap in [((0.8, 0.8, 0.8), 2), ((0.7, 0.3, 0.9), 3), ((1.1, 1.0, 1.0), 1), ((0.1, 0.6, 0.6), 7)]:
        pred, target = np.zeros((16, 12, 12), np.int64), np.zeros((16, 12, 12), np.int64)
        pred[3, 2:10, 2:10], target[3 + gap, 2:10, 2:10] = 1, 1
        cases.append((pred, target, spacing, gap * spacing[0]))
    rng = np.random.default_rng(0)
    while len(cases) < volumes:
        spacing = tuple(float(v) for v in rng.choice([0.3, 0.7, 0.8, 1.0, 1.5, 2.5], 3))
        pred, target = _blobs((10, 12, 11), 3, int(rng.integers(1 << 30)))
        cases.append((pred, target, spacing, float(rng.choice([0.7, 1.5, 1.6, 2.4]))))
    for pred, target, spacing, tolerance in cases:
        classes = int(max(pred.max(), target.max())) + 1
        ours = surface_dice(pred, target, classes, spacing=spacing, tolerance_mm=tolerance)
        hd = hausdorff95(pred, target, classes, spacing=spacing)
        p, t = _one_hot(pred, classes), _one_hot(target, classes)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = monai_metrics.compute_surface_dice(p, t, [tolerance] * classes, include_background=True,
                                                        spacing=spacing)[0].double()  # fmt: skip
            theirs_hd = monai_metrics.compute_hausdorff_distance(p, t, include_background=True, percentile=95,
                                                                 spacing=spacing)[0].double()  # fmt: skip
        np.testing.assert_allclose(
            ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6, err_msg=str(spacing)
        )  # MONAI: float32
        both = ~(ours.isnan() | theirs.isnan())
        np.testing.assert_allclose(hd[both].numpy(), theirs_hd[both].numpy(), rtol=1e-5, atol=1e-5)


def test_surface_metrics_take_batches_with_one_spacing_or_one_per_map():
    cases = [_blobs((10, 12, 12), 3, seed) for seed in range(3)]
    pred, target = np.stack([c[0] for c in cases]), np.stack([c[1] for c in cases])
    spacings = [(1.0, 1.0, 1.0), (2.0, 0.8, 0.8), (0.5, 0.5, 3.0)]
    hd, nsd = surface_metrics(pred, target, 3, spacing=spacings, tolerance_mm=1.5)
    assert hd.shape == nsd.shape == (3, 3) and hd.dtype == nsd.dtype == torch.float64
    for i, (p, t) in enumerate(cases):
        torch.testing.assert_close(hd[i], hausdorff95(p, t, 3, spacing=spacings[i]))
        torch.testing.assert_close(nsd[i], surface_dice(p, t, 3, spacing=spacings[i], tolerance_mm=1.5))
    shared = hausdorff95(pred, target, 3, spacing=(1.0, 1.0, 1.0))
    torch.testing.assert_close(shared[2], hausdorff95(cases[2][0], cases[2][1], 3, spacing=(1.0, 1.0, 1.0)))
    with pytest.raises(ShapeError, match="2 spacings for a batch of 3 label maps"):
        hausdorff95(pred, target, 3, spacing=spacings[:2])


def test_every_per_class_metric_is_float64():
    labels = torch.tensor([[0, 1], [1, 1]])
    assert boundary_iou(labels, labels, 2)[1].dtype == boundary_fscore(labels, labels, 2)[1].dtype == torch.float64
    assert mean_iou(labels, labels, 2)[1].dtype == torch.float64


def test_surface_metrics_refuse_mismatched_inputs():
    with pytest.raises(ShapeError, match=r"one spacing per axis \(or one per map\), got prediction \(4, 4, 4\)"):
        hausdorff95(np.zeros((4, 4, 4), int), np.zeros((4, 4, 4), int), 2, spacing=(1, 1, 1, 1))
    with pytest.raises(ShapeError, match=r"got prediction \(4, 4, 4\), target \(4, 4, 5\)"):
        hausdorff95(np.zeros((4, 4, 4), int), np.zeros((4, 4, 5), int), 2, spacing=(1, 1, 1))
    # (4, 4, 4) with a 2D spacing is a batch of four 2D maps, as MONAI reads (N, H, W)
    assert hausdorff95(np.zeros((4, 4, 4), int), np.zeros((4, 4, 4), int), 2, spacing=(1, 1)).shape == (4, 2)


def _reference_fscore(pred, target, num_classes, tolerance):
    """The boundary F-score from its definition: per class, contour pixels (a differently-labelled
    8-neighbour inside the image), matched within Euclidean distance by scipy's EDT."""
    from scipy.ndimage import distance_transform_edt, grey_dilation, grey_erosion

    def contour(labels, c):
        mask = labels == c
        lo = grey_erosion(labels, size=3, mode="nearest")
        hi = grey_dilation(labels, size=3, mode="nearest")
        return mask & ((lo != c) | (hi != c))

    sums = np.zeros((4, num_classes))
    for p, t in zip(pred, target):
        for c in range(num_classes):
            cp, ct = contour(p, c), contour(t, c)
            dt = distance_transform_edt(~ct) if ct.any() else np.full(ct.shape, np.inf)
            dp = distance_transform_edt(~cp) if cp.any() else np.full(cp.shape, np.inf)
            sums[:, c] += ((dt[cp] <= tolerance).sum(), cp.sum(), (dp[ct] <= tolerance).sum(), ct.sum())
    f = []
    for hit_p, n_p, hit_t, n_t in sums.T:
        if n_p + n_t == 0:
            f.append(np.nan)
            continue
        precision, recall = hit_p / max(n_p, 1), hit_t / max(n_t, 1)
        f.append(0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall))
    return np.array(f)


@pytest.mark.parametrize("tolerance", [0, 1, 2.5])
def test_boundary_fscore_equals_its_definition(tolerance):
    rng = np.random.default_rng(3)
    target = np.stack([_blobs((40, 56), 5, s)[1] for s in range(2)])
    pred = np.stack([_blobs((40, 56), 5, s)[0] for s in range(2)])
    pred[0, rng.random((40, 56)) < 0.02] = 3  # speckle
    mean, per_class = boundary_fscore(torch.from_numpy(pred), torch.from_numpy(target), 6, tolerance=tolerance)
    expected = _reference_fscore(pred, target, 6, tolerance)
    np.testing.assert_allclose(per_class.numpy(), expected, rtol=1e-9)
    assert mean == pytest.approx(np.nanmean(expected)) and math.isnan(per_class[5])


def test_boundary_fscore_streams_and_ignores():
    target = torch.zeros(2, 16, 16, dtype=torch.long)
    target[:, 4:12, 4:12] = 1
    shifted = torch.roll(target, 3, dims=2)
    acc = BoundaryFScore(2, tolerance=3)
    acc.update(shifted[:1], target[:1])
    acc.update(shifted[1:], target[1:])
    whole, _ = boundary_fscore(shifted, target, 2, tolerance=3)
    assert acc.compute()["boundary_fscore"] == pytest.approx(whole) and whole == pytest.approx(1.0)
    far = boundary_fscore(shifted, target, 2, tolerance=1)[0]
    assert 0 < far < 1
    ignored = target.clone()
    ignored[:, :, 6:] = 255
    assert boundary_fscore(shifted, ignored, 2, tolerance=1)[0] != far
    with pytest.raises(ConfigError, match=r"tolerance \(pixels\) must be a finite number >= 0, got -1"):
        BoundaryFScore(2, tolerance=-1)


def test_seed_intervals_and_paired_differences_match_scipy():
    from scipy import stats

    from upzoo.bench.stats import paired_difference, seed_interval
    from upzoo.bench.variants import parse_variants

    values, base = [0.61, 0.64, 0.62, 0.66], [0.60, 0.61, 0.60, 0.62]
    interval = seed_interval(values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert interval["ci_low"] == pytest.approx(low) and interval["ci_high"] == pytest.approx(high)
    diff = paired_difference(values, base)
    result = stats.ttest_rel(values, base)
    assert diff["diff"] == pytest.approx(np.mean(np.subtract(values, base)))
    assert diff["beyond"] == (result.pvalue < 0.05)
    assert paired_difference([0.5, 0.7], [0.6, 0.6])["beyond"] is False
    assert [v.label for v in parse_variants("transposed, interp_conv:mode=bilinear:align_corners=true")] == [
        "transposed",
        "interp_conv mode=bilinear align_corners=True",
    ]
    with pytest.raises(Exception, match="malformed option"):
        parse_variants("interp_conv:mode")
    swap = "transposed:last_upsampler=interp_conv:last_upsampler_options={mode: bilinear, kernel_size: 5},fir"
    first, second = parse_variants(swap)  # a mapping value keeps its commas and colons
    assert first.options == {"last_upsampler": "interp_conv",
                             "last_upsampler_options": {"mode": "bilinear", "kernel_size": 5}}  # fmt: skip
    assert second.name == "fir" and second.options == {}
    label = "transposed last_upsampler=interp_conv last_upsampler_options={mode: bilinear, kernel_size: 5}"
    assert first.label == label  # as the command line wrote it, not Python's repr


def test_variant_folders_are_plain_names():
    from upzoo.bench.plan import _slug
    from upzoo.bench.variants import parse_variants

    swap = parse_variants(
        "transposed:last_upsampler=interp_conv:last_upsampler_options={mode: nearest, kernel_size: 3}"
    )
    folder = "transposed_last_upsampler-interp_conv_last_upsampler_options-mode_nearest_kernel_size_3"
    assert _slug(swap[0].label) == folder
    assert _slug("interp_conv mode=nearest") == "interp_conv_mode-nearest"  # the folders of earlier plans
    assert _slug("jafar upsampler_run=runs/featup-jafar") == "jafar_upsampler_run-runs-featup-jafar"
    assert _slug("fir kernel=[1, 3, 3, 1]") == "fir_kernel-1_3_3_1"


def test_balanced_class_weights_follow_the_pixel_shares():
    from upzoo.train.tasks import balanced_class_weights, segmentation_loss

    masks = [torch.tensor([[0, 0, 0, 1], [0, 0, 255, 2]]), torch.tensor([[0, 0, 0, 0], [0, 1, 1, 255]])]
    dataset = [{"mask": m} for m in masks]
    weights = balanced_class_weights(dataset, 4, 255)
    share = torch.tensor([10, 3, 1, 0]) / 14
    torch.testing.assert_close(weights, (1 / torch.log(1.02 + share)).float())
    logits = torch.randn(2, 4, 2, 4)
    target = torch.stack(masks)
    expected = torch.nn.functional.cross_entropy(logits, target, weight=weights, ignore_index=255)
    got = segmentation_loss(logits, target, kind="ce", ignore_index=255, num_classes=4, weight=weights)
    torch.testing.assert_close(got, expected)


def _davis_f_measure_port(foreground_mask, gt_mask, void_pixels=None, bound_th=0.008):
    """A line-by-line port of ``f_measure`` and ``_seg2bmap`` from davisvideochallenge/
    davis2017-evaluation (``davis2017/metrics.py``), with skimage's ``disk`` written out (the same
    ``x² + y² <= r²`` over ``arange(-r, r + 1)``) since scikit-image is not a dependency."""
    import cv2

    void_pixels = np.zeros_like(foreground_mask).astype(bool) if void_pixels is None else void_pixels.astype(bool)
    bound_pix = bound_th if bound_th >= 1 else np.ceil(bound_th * np.linalg.norm(foreground_mask.shape))

    def seg2bmap(seg):
        seg = seg.astype(bool)
        e, s, se = np.zeros_like(seg), np.zeros_like(seg), np.zeros_like(seg)
        e[:, :-1] = seg[:, 1:]
        s[:-1, :] = seg[1:, :]
        se[:-1, :-1] = seg[1:, 1:]
        b = seg ^ e | seg ^ s | seg ^ se
        b[-1, :] = seg[-1, :] ^ e[-1, :]
        b[:, -1] = seg[:, -1] ^ s[:, -1]
        b[-1, -1] = 0
        return b

    def disk(radius):
        grid = np.arange(-radius, radius + 1)
        x, y = np.meshgrid(grid, grid)
        return (x**2 + y**2 <= radius**2).astype(np.uint8)

    fg_boundary = seg2bmap(foreground_mask * np.logical_not(void_pixels))
    gt_boundary = seg2bmap(gt_mask * np.logical_not(void_pixels))
    fg_dil = cv2.dilate(fg_boundary.astype(np.uint8), disk(bound_pix))
    gt_dil = cv2.dilate(gt_boundary.astype(np.uint8), disk(bound_pix))
    gt_match, fg_match = gt_boundary * fg_dil, fg_boundary * gt_dil
    n_fg, n_gt = np.sum(fg_boundary), np.sum(gt_boundary)
    if n_fg == 0 and n_gt > 0:
        precision, recall = 1, 0
    elif n_fg > 0 and n_gt == 0:
        precision, recall = 0, 1
    elif n_fg == 0 and n_gt == 0:
        precision, recall = 1, 1
    else:
        precision, recall = np.sum(fg_match) / float(n_fg), np.sum(gt_match) / float(n_gt)
    return 0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


@pytest.mark.parametrize("bound_th", [0.008, 0.02, 2])
def test_davis_fmeasure_equals_a_port_of_davis_f_measure(bound_th):
    from upzoo.metrics import davis_fmeasure

    rng = np.random.default_rng(7)
    frames = []
    for seed in range(12):
        pred, target = _blobs((1, 60, 90), 4, seed)
        frames.append((pred[0], target[0]))
    frames.append((np.zeros((60, 90), np.int64), np.zeros((60, 90), np.int64)))  # classes absent in both: 1
    pred = np.stack([f[0] for f in frames])
    target = np.stack([f[1] for f in frames])
    target[rng.random(target.shape) < 0.02] = 255  # void pixels
    mean, per_frame = davis_fmeasure(pred, target, 4, bound_th=bound_th)
    for n in range(len(frames)):
        void = target[n] == 255
        for c in range(4):
            expected = _davis_f_measure_port(pred[n] == c, target[n] == c, void, bound_th)
            assert per_frame[n, c].item() == pytest.approx(expected, abs=1e-12), (n, c)
    torch.testing.assert_close(mean, per_frame.mean(0))
    assert mean.dtype == torch.float64 and per_frame[-1].tolist() == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "spacing",
    [(0, 1, 1), (-1.0, 1, 1), (float("nan"), 1, 1), (float("inf"), 1, 1), (1e300, 1, 1), ("a", 1, 1),
     (True, 1, 1), 1.0, None, ()],
)  # fmt: skip
def test_surface_metrics_refuse_a_spacing_that_is_not_positive_finite_mm(spacing):
    # spacing 0 used to give HD95 0 and surface Dice 1: a silent number
    labels = np.zeros((4, 6, 6), dtype=np.int64)
    labels[1:3, 1:4, 1:4] = 1
    for metric in (hausdorff95, lambda p, t, k, spacing: surface_dice(p, t, k, spacing=spacing, tolerance_mm=1.0)):
        with pytest.raises(
            ConfigError, match=r"spacing \(one per axis, or one per map\) must be positive finite .*got"
        ):
            metric(labels, labels, 2, spacing=spacing)


def test_surface_metrics_take_a_spacing_as_a_tuple_an_array_or_a_tensor():
    pred, target = np.zeros((4, 6, 6), dtype=np.int64), np.zeros((4, 6, 6), dtype=np.int64)
    pred[1:3, 1:4, 1:4], target[1:3, 1:3, 1:4] = 1, 1
    expected = hausdorff95(pred, target, 2, spacing=(5.0, 0.8, 0.8))
    assert float(expected[1]) == pytest.approx(0.8)  # one row of voxels 0.8 mm away
    for spacing in (np.array([5.0, 0.8, 0.8]), torch.tensor([5.0, 0.8, 0.8], dtype=torch.float64), [5, 0.8, 0.8]):
        torch.testing.assert_close(hausdorff95(pred, target, 2, spacing=spacing), expected, rtol=1e-12, atol=0)


def test_seeds_to_resolve_is_the_first_count_whose_interval_is_narrow_enough():
    from scipy.stats import t

    from upzoo.bench.stats import seeds_to_resolve

    for spread, difference in ((0.036, 0.02), (0.0125, 0.02), (0.3, 0.02), (0.0, 0.01)):
        n = seeds_to_resolve(spread, difference)
        half = [t.ppf(0.975, k - 1) * spread / k**0.5 for k in (n - 1, n)]
        assert n >= 2 and half[1] < difference and (n == 2 or half[0] >= difference)
    assert seeds_to_resolve(0.5, 0.001, most=50) is None
    with pytest.raises(ValueError, match="difference > 0 expected"):
        seeds_to_resolve(0.1, 0.0)
