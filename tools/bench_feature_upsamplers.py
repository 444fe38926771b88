"""The cost of the image-guided feature upsamplers (JBU, JAFAR, LoftUp, AnyUp) against bilinear
upsampling, measured in one run: forward and forward+backward time, and peak memory (the
process's resident-set high-water mark above the inputs, reset before each measurement), for
384-channel features (a ViT-S's width) of one image, each measurement in a fresh process:

* ``448``: a 448x448 image with 1/14 features (32x32, x14) — NAF's setting;
* ``1024``: a 1024x1024 image with 1/16 features (64x64, x16);
* ``1024x2048``: forward only, chunked (the figure to reach: within 8 GB on the CPU);

each block whole and in bands of 32, 16 and 8 rows respectively (``chunk``); a whole run whose
attention weights alone would pass 16 GiB is not run, and the table says how much it would need.
Blocks at the authors' defaults (JAFAR and AnyUp qk_dim 128, LoftUp width C + 20); weights random
(the cost does not depend on them). Timings are medians of ``--rounds`` rounds at 448 (default 1;
one round at the larger sizes), the blocks interleaved in each round, with the spread
(max - min) / median when there are several, and the ratio to bilinear's. Chunked training passes
checkpoint each band (recomputed in the backward pass).

    python tools/bench_feature_upsamplers.py [--settings 448,1024,1024x2048] [--rounds 1] [--passes forward,backward]

``--passes backward`` measures forward+backward alone (1024x2048 has no backward pass here).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from upzoo import create_upsampler

BLOCKS = ["interpolate", "jbu", "jafar", "loftup", "anyup"]
#: image size, ratio, and the rows per band of the chunked runs
SETTINGS = {"448": ((448, 448), 14, 32), "1024": ((1024, 1024), 16, 16), "1024x2048": ((1024, 2048), 16, 8)}
CHANNELS = 384
TOO_BIG_GIB = 16  # a whole run whose attention weights alone would pass this is not run (the machine has 24)


def attention_gib(name: str, setting: str, chunk: int | None) -> float:
    """The attention weights one band holds at once (two (N, M) float32 tensors of one head)."""
    (height, width), scale, _ = SETTINGS[setting]
    if name not in ("jafar", "loftup", "anyup"):
        return 0.0
    rows = height if chunk is None else chunk  # chunked bands are checkpointed: one band at a time
    return 2 * rows * width * (height // scale) * (width // scale) * 4 / 2**30


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark back to the current size


def _block(name: str, scale: int, chunk: int | None) -> torch.nn.Module:
    options = {"mode": "bilinear"} if name == "interpolate" else {"guide_channels": 3, "chunk": chunk}
    torch.manual_seed(0)
    return create_upsampler(name, spatial_dims=2, in_channels=CHANNELS, out_channels=CHANNELS, scale=scale, **options)


def measure(name: str, setting: str, chunk: int | None, backward: bool) -> tuple[float, float]:
    """``(seconds, peak MiB above the inputs)`` of one forward (and backward) pass, in a fresh
    process (memory an earlier measurement freed would otherwise hide this one's peak)."""
    command = [sys.executable, __file__, "--one", json.dumps([name, setting, chunk, backward])]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    seconds, peak = json.loads(done.stdout.strip().splitlines()[-1])
    return seconds, peak


def measure_here(name: str, setting: str, chunk: int | None, backward: bool) -> tuple[float, float]:
    """:func:`measure` in this process."""
    (height, width), scale, _ = SETTINGS[setting]
    block = _block(name, scale, chunk)
    features = torch.randn(1, CHANNELS, height // scale, width // scale, requires_grad=backward)
    image = torch.rand(1, 3, height, width)
    _reset_peak()
    before = _rss_kib("VmRSS")
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        out = block(features) if name == "interpolate" else block(features, image)
        if backward:
            out.sum().backward()
    seconds = time.perf_counter() - start
    peak = (_rss_kib("VmHWM") - before) / 1024
    del out, block, features, image
    return seconds, peak


def _row(name: str, chunk: int | None, times: list[float], peak: float, reference: float | None) -> str:
    median = statistics.median(times)
    spread = f"{(max(times) - min(times)) / median:.0%}" if len(times) > 1 else "—"
    ratio = f"{median / reference:.1f}x" if reference else "1.0x"
    label = name if name != "interpolate" else "bilinear"
    return f"| {label} | {chunk or 'whole'} | {median:.3f} | {spread} | {ratio} | {peak:.0f} |"


def run_setting(setting: str, rounds: int, backward: bool) -> list[str]:
    chunk = SETTINGS[setting][2]
    whole = [] if setting == "1024x2048" else [(name, None) for name in BLOCKS]
    variants = [("interpolate", None)] + whole[1:] + [(name, chunk) for name in BLOCKS[1:]]
    runnable = [v for v in variants if attention_gib(v[0], setting, v[1]) * (3 if backward else 1) < TOO_BIG_GIB]
    times: dict[tuple, list[float]] = {v: [] for v in runnable}
    peaks: dict[tuple, float] = {}
    for _ in range(rounds):  # interleaved: every variant once per round
        for variant in runnable:
            seconds, peak = measure(variant[0], setting, variant[1], backward)
            print(f"  {setting} {'fwd+bwd' if backward else 'fwd'} {variant[0]} chunk {variant[1]}: {seconds:.2f} s, "
                  f"{peak:.0f} MiB", file=sys.stderr, flush=True)  # fmt: skip
            times[variant].append(seconds)
            peaks[variant] = max(peaks.get(variant, 0.0), peak)
    reference = statistics.median(times[("interpolate", None)])
    lines = []
    for name, c in variants:
        if (name, c) in times:
            lines.append(
                _row(name, c, times[(name, c)], peaks[(name, c)], reference if name != "interpolate" else None)
            )
        else:
            need = attention_gib(name, setting, c) * (3 if backward else 1)
            lines.append(
                f"| {name} | {c or 'whole'} | not run: the attention weights alone need ~{need:.0f} GiB | | | |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default="448,1024,1024x2048")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--passes", default="forward,backward", help="forward, backward (forward+backward) or both")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # one measurement (a child process)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure_here(*json.loads(args.one))))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {CHANNELS} channels, batch 1")
    wanted = {p: p in args.passes.split(",") for p in ("forward", "backward")}
    for setting in args.settings.split(","):
        kinds = {False: "forward", True: "backward"}
        passes = [b for b in (False, True) if wanted[kinds[b]] and not (b and setting == "1024x2048")]
        for backward in passes:
            what = "forward + backward" if backward else "forward"
            (h, w), scale, _ = SETTINGS[setting]
            print(f"\n{h}x{w} image, x{scale} from {h // scale}x{w // scale}, {what}:\n")
            print("| block | chunk | seconds (median) | spread | vs bilinear | peak MiB |")
            print("|---|---|---|---|---|---|")
            rounds = args.rounds if setting == "448" else 1
            for line in run_setting(setting, rounds, backward):
                print(line, flush=True)


if __name__ == "__main__":
    main()
