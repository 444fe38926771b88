"""Write ``*_gtFine_labelTrainIds.png`` next to every ``*_gtFine_labelIds.png`` of a Cityscapes folder.

Files already converted are skipped; source files are never overwritten (each output is written to a
temporary file and renamed). upzoo reads ``labelTrainIds`` directly when they exist.

    python tools/prepare_cityscapes.py /data/cityscapes [--splits train val]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from upzoo.data.cityscapes import to_train_ids
from upzoo.data.io import read_label, write_png
from upzoo.errors import UpzooError


def convert(root: Path, splits: list[str]) -> tuple[int, int]:
    """Convert every labelIds file of ``splits`` under ``root``; return (written, skipped)."""
    sources = []
    for split in splits:
        folder = root / "gtFine" / split
        if not folder.is_dir():
            raise UpzooError(f"missing folder {folder}: expected a Cityscapes root with gtFine/{split}/<city>/")
        sources += sorted(folder.glob("*/*_gtFine_labelIds.png"))
    if not sources:
        raise UpzooError(f"no *_gtFine_labelIds.png files under {root}/gtFine/{{{','.join(splits)}}}")
    written = skipped = 0
    for source in tqdm(sources, desc="labelTrainIds", unit="file"):
        target = source.with_name(source.name.replace("_labelIds.png", "_labelTrainIds.png"))
        if target.exists():
            skipped += 1
            continue
        try:
            write_png(target, to_train_ids(read_label(source)))
        except UpzooError as exc:
            raise UpzooError(f"{source}: {exc}") from None
        written += 1
    return written, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="Cityscapes root (holds gtFine/)")
    parser.add_argument("--splits", nargs="+", default=["train", "val"], help="splits to convert")
    args = parser.parse_args(argv)
    try:
        written, skipped = convert(args.root, args.splits)
    except UpzooError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {written} labelTrainIds files, skipped {skipped} already converted", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
