"""Using trained models (issue: predict/sample/export), every figure a ratio against a reference
measured in the same run, interleaved, median and interquartile range:

1. `upzoo predict` (predict_files: reading, batching, writing PNGs) over a folder of images vs a bare
   `model(x)` loop over the same images already in memory as tensors;
2. onnxruntime (CPU) and torch.compile (inductor) inference vs eager PyTorch, same model and input;
3. the exported masked blur in onnxruntime vs the fused CPU kernel, 64x3x64x64.

Models: the quickstart U-Net at 128x256 (its generated resolution) and a resnet18 U-Net at 512x1024
(random weights: speed does not depend on them).

    python tools/bench_deploy.py [--images 64] [--big-images 16] [--rounds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from upzoo.inference.predictor import Predictor
from upzoo.inference.run import PredictOptions, predict_files
from upzoo.recipe import load_recipe, parse_recipe
from upzoo.runs.trained_model import LoadedModel

ROOT = Path(__file__).resolve().parent.parent


def _loaded(recipe) -> LoadedModel:
    from upzoo.data.cityscapes import CLASS_NAMES, PALETTE
    from upzoo.models import build_model

    torch.manual_seed(0)
    model = build_model(recipe.model).eval()
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    return LoadedModel(model, recipe, recipe.model, Path("random.pt"), list(CLASS_NAMES), PALETTE, mean, std, None)


def _models() -> dict[str, tuple[LoadedModel, tuple[int, int]]]:
    quick = load_recipe(ROOT / "recipes" / "quickstart.yaml")
    big = parse_recipe(
        {
            "model": {"architecture": "unet", "spatial_dims": 2, "in_channels": 3, "num_classes": 19,
                      "encoder": "resnet18", "upsampler": "transposed"},
            "data": {"crop_size": [512, 1024]},
        }
    )  # fmt: skip
    return {"quickstart U-Net": (_loaded(quick), (128, 256)), "resnet18 U-Net": (_loaded(big), (512, 1024))}


def _spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{statistics.median(values) * 1000:.1f} ms (IQR {q[0] * 1000:.1f}-{q[2] * 1000:.1f})"


def _interleaved(runs: dict, rounds: int) -> dict[str, list[float]]:
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            start = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - start)
    return times


def _images(folder: Path, size: tuple[int, int], count: int) -> list[np.ndarray]:
    """Smooth random scenes (low-frequency noise) as PNG files, like photos in how they compress."""
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    images = []
    for i in range(count):
        coarse = rng.integers(0, 255, (size[0] // 16, size[1] // 16, 3), dtype=np.uint8)
        image = np.asarray(Image.fromarray(coarse).resize((size[1], size[0]), Image.BILINEAR))
        image = np.clip(image + rng.normal(0, 6, image.shape), 0, 255).astype(np.uint8)
        Image.fromarray(image).save(folder / f"img_{i:03d}.png")
        images.append(image)
    return images


def bench_predict(name: str, loaded: LoadedModel, size, count: int, rounds: int, tmp: Path) -> None:
    folder = tmp / name.replace(" ", "_")
    images = _images(folder, size, count)
    predictor = Predictor(loaded)
    tensors = [predictor.preprocess(image) for image in images]
    batch = 4

    def bare() -> None:
        with torch.no_grad():
            for i in range(0, len(tensors), batch):
                loaded.model(torch.stack(tensors[i : i + batch]))

    def predict() -> None:
        options = PredictOptions(tmp / "out", batch_size=batch, num_workers=2, overwrite=True, progress=False)
        predict_files(predictor, [folder], options)

    times = _interleaved({"bare model(x) loop": bare, "upzoo predict": predict}, rounds)
    ratio = statistics.median(times["upzoo predict"]) / statistics.median(times["bare model(x) loop"])
    print(f"\n{name}, {count} images {size[0]}x{size[1]}, batch {batch}, {rounds} rounds")
    for key, values in times.items():
        print(f"  {key:<22} {_spread(values)} per pass, {count / statistics.median(values):.2f} images/s")
    print(f"  predict / bare loop: {ratio:.3f}x")


def bench_runtimes(name: str, loaded: LoadedModel, size, rounds: int, tmp: Path) -> None:
    import onnxruntime as ort

    from upzoo.inference.export import _write_onnx

    model = loaded.model
    x = torch.randn(1, 3, *size)
    path = tmp / f"{name.replace(' ', '_')}.onnx"
    _write_onnx(model, x, path, None)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {"input": x.numpy()}
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(model, backend="inductor")
        with torch.no_grad():
            compiled(x)

    def eager() -> None:
        with torch.no_grad():
            model(x)

    def inductor() -> None:
        with torch.no_grad():
            compiled(x)

    times = _interleaved({"eager": eager, "onnxruntime": lambda: session.run(None, feed), "inductor": inductor}, rounds)
    base = statistics.median(times["eager"])
    print(f"\n{name}, 1x3x{size[0]}x{size[1]}, {rounds} rounds")
    for key, values in times.items():
        print(f"  {key:<12} {_spread(values)}  speed-up vs eager {base / statistics.median(values):.2f}x")


def bench_blur(rounds: int, tmp: Path) -> None:
    import onnxruntime as ort

    from upzoo.filters.masked_blur import FUSED_CPU_KERNEL, MaskedGaussianBlur, masked_gaussian_blur
    from upzoo.inference.export import _write_onnx

    block = MaskedGaussianBlur(threshold=0.5, channels=3)
    x = torch.rand(64, 3, 64, 64)
    _write_onnx(block, x, tmp / "blur.onnx", None)
    session = ort.InferenceSession(str(tmp / "blur.onnx"), providers=["CPUExecutionProvider"])
    feed = {"input": x.numpy()}
    times = _interleaved(
        {
            "fused kernel": lambda: masked_gaussian_blur(x, threshold=0.5),
            "onnxruntime": lambda: session.run(None, feed),
        },
        rounds,
    )
    ratio = statistics.median(times["onnxruntime"]) / statistics.median(times["fused kernel"])
    print(f"\nmasked blur 64x3x64x64 (fused kernel built: {FUSED_CPU_KERNEL}), {rounds} rounds")
    for key, values in times.items():
        print(f"  {key:<13} {_spread(values)}")
    print(f"  onnxruntime / fused kernel time: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=64, help="Images for the quickstart model's predict run.")
    parser.add_argument("--big-images", type=int, default=16, help="Images for the resnet18 U-Net's predict run.")
    parser.add_argument("--rounds", type=int, default=10, help="Rounds for the runtime comparisons.")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    models = _models()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (quick, quick_size), (big, big_size) = models["quickstart U-Net"], models["resnet18 U-Net"]
        bench_predict("quickstart U-Net", quick, quick_size, args.images, 3, tmp)
        bench_predict("resnet18 U-Net", big, big_size, args.big_images, 2, tmp)
        for name, (loaded, size) in models.items():
            bench_runtimes(name, loaded, size, args.rounds, tmp)
        bench_blur(2 * args.rounds, tmp)


if __name__ == "__main__":
    main()
