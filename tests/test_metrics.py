"""Metrics against independent references: torchmetrics and cityscapesscripts' own evaluation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image
from torchmetrics.classification import MulticlassJaccardIndex

from upzoo.data.cityscapes import LABELS, to_train_ids
from upzoo.errors import ConfigError, ShapeError
from upzoo.metrics import ConfusionMatrix, confusion_matrix, mean_iou


@pytest.mark.parametrize("num_classes, shape", [(19, (4, 64, 128)), (3, (2, 7, 9, 11)), (300, (2, 64, 64))])
def test_iou_equals_torchmetrics_on_random_maps(num_classes, shape):
    g = torch.Generator().manual_seed(num_classes)
    target = torch.randint(0, num_classes, shape, generator=g)
    target[torch.rand(shape, generator=g) < 0.1] = 255 if num_classes < 255 else 1000
    pred = torch.randint(0, num_classes, shape, generator=g)
    ignore = 255 if num_classes < 255 else 1000
    reference = MulticlassJaccardIndex(num_classes, ignore_index=ignore, average="none")(pred, target).double()
    miou, per_class = mean_iou(pred, target, num_classes, ignore_index=ignore)
    present = ~torch.isnan(per_class)
    torch.testing.assert_close(per_class[present], reference[present])
    assert math.isclose(miou, float(per_class[present].mean()))


def test_absent_classes_are_nan_and_left_out_while_false_positives_count_zero():
    target = torch.tensor([0, 0, 1, 1, 255])
    pred = torch.tensor([0, 0, 1, 2, 3])  # class 2 predicted but absent from the ground truth; class 3 only on ignore
    miou, iou = mean_iou(pred, target, num_classes=5)
    assert iou[0] == 1.0 and iou[1] == 0.5 and iou[2] == 0.0
    assert math.isnan(iou[3]) and math.isnan(iou[4])  # ignored pixels do not count; 4 absent from both
    assert math.isclose(miou, (1.0 + 0.5 + 0.0) / 3)


def test_accumulator_equals_one_shot_and_survives_a_reduce_without_ddp():
    g = torch.Generator().manual_seed(1)
    preds = [torch.randint(0, 5, (2, 9, 9), generator=g) for _ in range(3)]
    targets = [torch.randint(0, 5, (2, 9, 9), generator=g) for _ in range(3)]
    acc = ConfusionMatrix(5)
    for p, t in zip(preds, targets):
        acc.update(p, t)
    acc.sync()
    result = acc.compute()
    miou, iou = mean_iou(torch.cat(preds), torch.cat(targets), 5)
    assert result["miou"] == pytest.approx(miou) and result["per_class_iou"] == pytest.approx(iou.tolist())
    total = confusion_matrix(torch.cat(preds), torch.cat(targets), 5)
    assert result["pixel_accuracy"] == pytest.approx(float(total.diagonal().sum() / total.sum()))
    dice = 2 * total.diagonal() / (total.sum(0) + total.sum(1))
    assert result["per_class_dice"] == pytest.approx(dice.tolist())


@pytest.mark.parametrize(
    "pred, target, error, message",
    [
        (torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long), ShapeError, "differ in shape"),
        (torch.zeros(4), torch.zeros(4, dtype=torch.long), ConfigError, "integer class indices"),
        (
            torch.tensor([0, 5]),
            torch.tensor([0, 1]),
            ConfigError,
            r"prediction labels must be in 0..4, got values in 0..5",
        ),
        (
            torch.tensor([0, 1]),
            torch.tensor([0, 7]),
            ConfigError,
            r"target labels must be in 0..4 or 255, got values in 0..7",
        ),
    ],
)
def test_bad_inputs_raise(pred, target, error, message):
    with pytest.raises(error, match=message):
        confusion_matrix(pred, target, 5)


def _cityscapes_reference(pairs, tmp_path):
    """cityscapesscripts' pixel-level evaluation, called from Python on label-id PNGs."""
    from cityscapesscripts.evaluation import evalPixelLevelSemanticLabeling as ev

    ev.args.evalInstLevelScore = False
    ev.args.evalPixelAccuracy = False
    ev.args.quiet = True
    matrix = ev.generateMatrix(ev.args)
    for i, (pred_ids, gt_ids) in enumerate(pairs):
        pred_file, gt_file = tmp_path / f"pred{i}.png", tmp_path / f"gt{i}_gtFine_labelIds.png"
        Image.fromarray(pred_ids.astype(np.uint8)).save(pred_file)
        Image.fromarray(gt_ids.astype(np.uint8)).save(gt_file)
        ev.evaluatePair(str(pred_file), str(gt_file), matrix, {}, {}, ev.args)
    trained = sorted((label for label in LABELS if label.train_id != 255), key=lambda l: l.train_id)
    return [ev.getIouScoreForLabel(label.id, matrix, ev.args) for label in trained]


def test_iou_equals_cityscapesscripts_on_real_shaped_label_maps(tmp_path):
    rng = np.random.default_rng(0)
    train_to_id = np.array([label.id for label in sorted(LABELS, key=lambda l: l.train_id) if label.train_id != 255])
    ids_all = np.array([label.id for label in LABELS if label.id >= 0])
    pairs, acc = [], ConfusionMatrix(19)
    for _ in range(2):
        gt = rng.choice(ids_all, size=(256, 512)).astype(np.int64)  # all 34 ids, ignored ones included
        gt[:, :200] = 7  # a large road region so some classes dominate, as in real scenes
        pred_train = rng.integers(0, 19, size=(256, 512))
        pred_train[:, :180] = 0
        pred_train[0:8, 0:8] = 18  # a class predicted where the ground truth has none of it
        pairs.append((train_to_id[pred_train], gt))
        acc.update(torch.from_numpy(pred_train), torch.from_numpy(to_train_ids(gt).astype(np.int64)))
    expected = _cityscapes_reference(pairs, tmp_path)
    ours = acc.compute()["per_class_iou"]
    assert ours == pytest.approx(expected, nan_ok=True)


# -- Boundary IoU ------------------------------------------------------------------------------------
def _boundary_reference(labels: np.ndarray, cls: int, dilation: int) -> np.ndarray:
    """The paper's reference construction: the class mask minus its erosion by ``dilation``
    iterations of a 3x3 square, the image padded with background (so its border is a contour)."""
    import cv2

    mask = (labels == cls).astype(np.uint8)
    padded = cv2.copyMakeBorder(mask, 1, 1, 1, 1, cv2.BORDER_CONSTANT, value=0)
    eroded = cv2.erode(padded, np.ones((3, 3), np.uint8), iterations=dilation)[1:-1, 1:-1]
    return (mask - eroded).astype(bool)


def _boundary_iou_reference(preds, targets, num_classes, ratio, ignore=255):
    inter, union = np.zeros(num_classes), np.zeros(num_classes)
    for p, t in zip(preds, targets):
        d = max(1, int(round(ratio * np.hypot(*t.shape))))
        valid = t != ignore
        for c in range(num_classes):
            gb, pb = _boundary_reference(t, c, d) & valid, _boundary_reference(p, c, d) & valid
            inter[c] += (gb & pb).sum()
            union[c] += (gb | pb).sum()
    with np.errstate(invalid="ignore"):
        return np.where(union > 0, inter / np.maximum(union, 1), np.nan)


def _blobs(rng, shape, classes, count):
    labels = np.zeros(shape, np.int64)
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    for _ in range(count):
        cy, cx, r = rng.uniform(0, shape[0]), rng.uniform(0, shape[1]), rng.uniform(2, shape[0] / 3)
        labels[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.integers(0, classes)
    return labels


@pytest.mark.parametrize("ratio", [0.005, 0.02, 0.08])
def test_boundary_iou_equals_the_papers_erosion_construction(ratio):
    from upzoo.metrics import BoundaryIoU

    rng = np.random.default_rng(int(ratio * 1000))
    targets = [_blobs(rng, (48, 64), 5, 12) for _ in range(3)]
    preds = [np.where(rng.random(t.shape) < 0.05, rng.integers(0, 5, t.shape), np.roll(t, 2, axis=1)) for t in targets]
    targets[0][:5, :5] = 255  # ignored pixels are not counted
    acc = BoundaryIoU(num_classes=5, dilation_ratio=ratio)
    for p, t in zip(preds, targets):
        acc.update(torch.from_numpy(p)[None], torch.from_numpy(t)[None])
    expected = _boundary_iou_reference(preds, targets, 5, ratio)
    np.testing.assert_allclose(acc.compute()["per_class_boundary_iou"], expected, rtol=1e-12)


def test_boundary_iou_streams_and_keeps_nan_for_absent_classes():
    from upzoo.metrics import BoundaryIoU, boundary_iou

    rng = np.random.default_rng(0)
    t = torch.from_numpy(np.stack([_blobs(rng, (32, 32), 3, 6) for _ in range(4)]))
    p = torch.roll(t, 1, dims=2)
    whole, per_class = boundary_iou(p, t, num_classes=4)
    acc = BoundaryIoU(num_classes=4)
    acc.update(p[:2], t[:2])
    acc.update(p[2:], t[2:])
    assert acc.compute()["boundary_iou"] == pytest.approx(whole)
    assert math.isnan(per_class[3]) and 0 < whole < 1
    assert boundary_iou(t, t, num_classes=4)[0] == 1.0
    with pytest.raises(ShapeError, match="Boundary IoU takes label maps"):
        acc.update(p, t[:1])
