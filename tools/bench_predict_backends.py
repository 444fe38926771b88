"""`upzoo predict` throughput per backend (issue: deploy like the peers): the same folder of images
predicted by `predict_files` with the eager PyTorch model and with its verified ONNX export in
onnxruntime (exported once, before timing), interleaved rounds, median images/s and the ratio to
eager, and the share of pixels whose labels agree. Models as tools/bench_deploy.py: the quickstart
U-Net at 128x256 and a resnet18 U-Net at 512x1024 (random weights: speed does not depend on them).

    python tools/bench_predict_backends.py [--images 32] [--big-images 8] [--rounds 3]

Run it alone: other processes on the cores distort multi-threaded PyTorch several-fold.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_deploy import _images, _models  # noqa: E402

from upzoo.inference.export import export_model  # noqa: E402
from upzoo.inference.predictor import Predictor  # noqa: E402
from upzoo.inference.run import PredictOptions, predict_files  # noqa: E402


def _run(predictor: Predictor, folder: Path, out: Path) -> float:
    start = time.perf_counter()
    options = PredictOptions(out, batch_size=4, num_workers=2, overwrite=True, progress=False)
    written = predict_files(predictor, [folder], options)["written"]
    return written / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--big-images", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {args.rounds} interleaved rounds\n")
    print("| model | backend | images/s | vs eager | labels equal to eager |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, (loaded, size) in _models().items():
            folder = tmp / name.replace(" ", "_")
            _images(folder, size, args.big_images if "resnet" in name else args.images)
            onnx = export_model(loaded, "onnx", tmp / f"{folder.name}.onnx")["path"]
            predictors = {
                "eager": Predictor(loaded, window="off"),
                "onnxruntime": Predictor(loaded, window="off", backend="onnxruntime", onnx_path=onnx),
            }
            rates: dict[str, list[float]] = {k: [] for k in predictors}
            for _ in range(args.rounds):
                for backend, predictor in predictors.items():
                    rates[backend].append(_run(predictor, folder, tmp / f"out-{folder.name}-{backend}"))
            eager_out, ort_out = tmp / f"out-{folder.name}-eager", tmp / f"out-{folder.name}-onnxruntime"
            agree = np.mean(
                [
                    (np.asarray(Image.open(p)) == np.asarray(Image.open(ort_out / p.name))).mean()
                    for p in sorted(eager_out.glob("*.png"))
                ]
            )
            base = statistics.median(rates["eager"])
            for backend, values in rates.items():
                rate = statistics.median(values)
                share = "—" if backend == "eager" else f"{100 * agree:.3f} %"
                print(f"| {name} | {backend} | {rate:.2f} | {rate / base:.2f}x | {share} |")


if __name__ == "__main__":
    main()
