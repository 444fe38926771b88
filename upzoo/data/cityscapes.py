"""Cityscapes: the official label table, label-id -> train-id mapping, and the dataset reader for the
official layout ``leftImg8bit/{split}/{city}/*_leftImg8bit.png`` + ``gtFine/{split}/{city}/
*_gtFine_labelIds.png`` (or ``*_labelTrainIds.png`` where present)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import numpy as np
import torch
from torch.utils.data import Dataset

from upzoo.data.io import read_image, read_label
from upzoo.data.seeding import reseed
from upzoo.errors import DataError

__all__ = [
    "Label",
    "LABELS",
    "CLASS_NAMES",
    "PALETTE",
    "IGNORE_INDEX",
    "to_train_ids",
    "CityscapesDataset",
    "CityscapesPair",
    "find_pairs",
]

IGNORE_INDEX = 255


class Label(NamedTuple):
    name: str
    id: int
    train_id: int  # 255: ignored in training and evaluation
    color: tuple[int, int, int]


#: The 34 Cityscapes label ids and the license plate (id -1); 19 of them are trained on.
LABELS: tuple[Label, ...] = (
    Label("unlabeled", 0, 255, (0, 0, 0)),
    Label("ego vehicle", 1, 255, (0, 0, 0)),
    Label("rectification border", 2, 255, (0, 0, 0)),
    Label("out of roi", 3, 255, (0, 0, 0)),
    Label("static", 4, 255, (0, 0, 0)),
    Label("dynamic", 5, 255, (111, 74, 0)),
    Label("ground", 6, 255, (81, 0, 81)),
    Label("road", 7, 0, (128, 64, 128)),
    Label("sidewalk", 8, 1, (244, 35, 232)),
    Label("parking", 9, 255, (250, 170, 160)),
    Label("rail track", 10, 255, (230, 150, 140)),
    Label("building", 11, 2, (70, 70, 70)),
    Label("wall", 12, 3, (102, 102, 156)),
    Label("fence", 13, 4, (190, 153, 153)),
    Label("guard rail", 14, 255, (180, 165, 180)),
    Label("bridge", 15, 255, (150, 100, 100)),
    Label("tunnel", 16, 255, (150, 120, 90)),
    Label("pole", 17, 5, (153, 153, 153)),
    Label("polegroup", 18, 255, (153, 153, 153)),
    Label("traffic light", 19, 6, (250, 170, 30)),
    Label("traffic sign", 20, 7, (220, 220, 0)),
    Label("vegetation", 21, 8, (107, 142, 35)),
    Label("terrain", 22, 9, (152, 251, 152)),
    Label("sky", 23, 10, (70, 130, 180)),
    Label("person", 24, 11, (220, 20, 60)),
    Label("rider", 25, 12, (255, 0, 0)),
    Label("car", 26, 13, (0, 0, 142)),
    Label("truck", 27, 14, (0, 0, 70)),
    Label("bus", 28, 15, (0, 60, 100)),
    Label("caravan", 29, 255, (0, 0, 90)),
    Label("trailer", 30, 255, (0, 0, 110)),
    Label("train", 31, 16, (0, 80, 100)),
    Label("motorcycle", 32, 17, (0, 0, 230)),
    Label("bicycle", 33, 18, (119, 11, 32)),
    Label("license plate", -1, 255, (0, 0, 142)),
)
_TRAINED = sorted((label for label in LABELS if label.train_id != 255), key=lambda label: label.train_id)
#: The 19 class names in train-id order.
CLASS_NAMES: tuple[str, ...] = tuple(label.name for label in _TRAINED)
#: ``(20, 3)`` uint8 colours: the 19 train ids, then black for 255 (index with ``min(id, 19)``).
PALETTE = np.array([label.color for label in _TRAINED], dtype=np.uint8)  # one colour per trained class
_LUT = np.full(35, IGNORE_INDEX, dtype=np.uint8)  # index: label id + 1 (so the license plate's -1 fits)
for _label in LABELS:
    _LUT[_label.id + 1] = _label.train_id

T = TypeVar("T", np.ndarray, torch.Tensor)


def to_train_ids(label_ids: T) -> T:
    """Map Cityscapes label ids (-1..33) to train ids (0..18, 255 for ignored), array or tensor.

    >>> to_train_ids(np.array([7, 8, 0, 26, -1])).tolist()
    [0, 1, 255, 13, 255]

    Raises:
        DataError: ids outside -1..33 (not a Cityscapes ``labelIds`` map).
    """
    if isinstance(label_ids, torch.Tensor):
        bad = label_ids[(label_ids < -1) | (label_ids > 33)]
        if bad.numel():
            raise DataError(
                f"label ids outside the Cityscapes table (-1..33): {sorted(set(bad.unique().tolist()))[:10]}"
            )
        lut = torch.from_numpy(_LUT.astype(np.int64)).to(label_ids.device)
        return lut[label_ids.long() + 1]
    ids = np.asarray(label_ids)
    bad = ids[(ids < -1) | (ids > 33)]
    if bad.size:
        raise DataError(f"label ids outside the Cityscapes table (-1..33): {sorted(set(np.unique(bad).tolist()))[:10]}")
    return _LUT[ids.astype(np.int64) + 1]


@dataclass(frozen=True)
class CityscapesPair:
    image: Path
    label: Path
    train_ids: bool  # the label file already holds train ids


def find_pairs(root: str | Path, split: str) -> list[CityscapesPair]:
    """Image/label pairs of ``split`` in the official layout, sorted by path.

    Raises:
        DataError: missing folders, an image without its label, or no images at all.
    """
    root = Path(root)
    images_dir, labels_dir = root / "leftImg8bit" / split, root / "gtFine" / split
    for folder in (images_dir, labels_dir):
        if not folder.is_dir():
            raise DataError(
                f"missing folder {folder}: a Cityscapes root holds leftImg8bit/{split}/<city>/ and "
                f"gtFine/{split}/<city>/"
            )
    pairs = []
    for image in sorted(images_dir.glob("*/*_leftImg8bit.png")):
        stem = image.name[: -len("_leftImg8bit.png")]
        city = image.parent.name
        train_ids = labels_dir / city / f"{stem}_gtFine_labelTrainIds.png"
        label_ids = labels_dir / city / f"{stem}_gtFine_labelIds.png"
        if train_ids.is_file():
            pairs.append(CityscapesPair(image, train_ids, True))
        elif label_ids.is_file():
            pairs.append(CityscapesPair(image, label_ids, False))
        else:
            raise DataError(f"image {image} has no label: expected {label_ids}")
    if not pairs:
        raise DataError(f"no images matching {images_dir}/<city>/*_leftImg8bit.png: the {split!r} split is empty")
    return pairs


class CityscapesDataset(Dataset):
    """Samples ``{"image": (3, H, W) float, "mask": (H, W) int64 train ids, "name": str}``.

    Args:
        root: a folder in the official Cityscapes layout.
        split: ``train``, ``val`` or ``test``.
        transform: an albumentations pipeline taking ``image`` and ``mask`` (see
            :mod:`upzoo.data.transforms`); it must end with ``ToTensorV2``.

    Raises:
        DataError: layout problems (at construction); unreadable files, size mismatches and ids
            outside the table (when the sample is read), always naming the file.
    """

    num_classes = len(CLASS_NAMES)
    ignore_index = IGNORE_INDEX

    def __init__(self, root: str | Path, split: str = "train", transform: Callable | None = None) -> None:
        self.root, self.split, self.transform = Path(root), split, transform
        self.pairs = find_pairs(self.root, split)
        self.seed, self.epoch = 0, 0  # augmentation depends only on (seed, epoch, index)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict:
        pair = self.pairs[index]
        image = read_image(pair.image)
        label = read_label(pair.label)
        if label.shape != image.shape[:2]:
            raise DataError(
                f"{pair.label}: label size {label.shape} does not match image {pair.image} {image.shape[:2]}"
            )
        if pair.train_ids:
            bad = np.unique(label[(label > 18) & (label != IGNORE_INDEX)])
            if bad.size:
                raise DataError(f"{pair.label}: train ids outside 0..18 and 255: {bad.tolist()[:10]}")
            mask = label
        else:
            try:
                mask = to_train_ids(label)
            except DataError as exc:
                raise DataError(f"{pair.label}: {exc}") from None
        reseed(self.transform, self.seed, self.epoch, index)
        if self.transform is not None:
            out = self.transform(image=image, mask=mask)
            image_t, mask_t = out["image"], out["mask"]
        else:
            image_t = torch.from_numpy(image).permute(2, 0, 1).float() / 255.0
            mask_t = torch.from_numpy(mask)
        return {"image": image_t, "mask": mask_t.long(), "name": pair.image.name}
