"""Measurement: FPS, peak memory, FLOPs, checkerboard scores and the bench commands."""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import warnings

import pytest
import torch
import yaml
from torch import nn

from conftest import cli_streams, run_cli, small_recipe
from upzoo import create_upsampler
from upzoo.bench.artifacts import checkerboard_score, image_checkerboard, overlap_pattern, overlap_unevenness
from upzoo.bench.block_table import bench_blocks, count_flops
from upzoo.bench.memory import peak_memory
from upzoo.bench.speed import compare_calls, measure_fps, time_call
from upzoo.upsamplers import CheckerboardWarning


def _fresh(name: str, seed: int, **options):
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckerboardWarning)
        return create_upsampler(name, spatial_dims=2, in_channels=32, out_channels=32, scale=2, **options)


def test_known_checkerboard_behaviour_of_fresh_blocks():
    def mean_score(name, **options):
        return sum(checkerboard_score(_fresh(name, s, **options), (2, 32, 32, 32), seed=s) for s in range(4)) / 4

    k3 = mean_score("transposed", kernel_size=3, padding=1, output_padding=1)
    k2 = mean_score("transposed")
    assert k3 > 0.3 and k2 < 0.1 and k3 > 4 * k2
    assert mean_score("pixel_shuffle") < 1e-5  # ICNR: every phase identical (up to a GEMM's float32 rounding)
    assert mean_score("interp_conv") < 0.02 and mean_score("interp_conv", mode="bilinear") < 0.02
    assert mean_score("fir") < 0.02 and mean_score("fir", kernel_size=None) < 0.01  # the low-pass fills every phase
    assert mean_score("pixel_shuffle", icnr=False) > mean_score("pixel_shuffle")


def test_checkerboard_of_trained_blocks_follows_what_they_learned():
    block = _fresh("transposed", 0, kernel_size=3, padding=1, output_padding=1)
    before = checkerboard_score(block, (2, 32, 16, 16))
    with torch.no_grad():  # the "trained" solution for a flat response: equal sums per phase
        block.conv.weight.zero_()
        for c in range(32):
            block.conv.weight[c, c] = torch.tensor([[0.25, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 0.25]])
        block.conv.bias.zero_()
    assert before > 0.3 and checkerboard_score(block, (2, 32, 16, 16)) < 0.05


def test_theoretical_overlap_pattern():
    assert overlap_pattern((3, 3), (2, 2)).tolist() == [[4.0, 2.0], [2.0, 1.0]]
    assert overlap_unevenness((3, 3), (2, 2)) == pytest.approx(0.4843, abs=1e-3)
    assert overlap_unevenness((4, 4), (2, 2)) == 0 and overlap_unevenness((2, 2), (2, 2)) == 0


def test_image_checkerboard_separates_patterns_from_texture():
    g = torch.Generator().manual_seed(0)
    texture = torch.rand(4, 3, 32, 32, generator=g)
    board = texture.clone()
    board[..., ::2, ::2] += 0.5
    assert image_checkerboard(texture) < 0.1 and image_checkerboard(board) > 0.5


def test_fps_is_defined_for_a_single_iteration_and_image():
    model = nn.Conv2d(3, 4, 3, padding=1)
    result = measure_fps(model, (1, 3, 32, 32), warmup=0, iters=1)
    assert math.isfinite(result["fps"]) and result["fps"] > 0 and result["batch"] == 1
    assert result["torch"] == torch.__version__ and result["threads"] == torch.get_num_threads()
    assert model.training  # restored


def test_timing_helpers_report_median_and_spread():
    t = time_call(lambda: sum(range(1000)), warmup=1, runs=5)
    assert t.runs == 5 and t.q1 <= t.median <= t.q3
    both = compare_calls({"a": lambda: None, "b": lambda: sum(range(10000))}, runs=5)
    assert both["b"].median > both["a"].median


def test_peak_memory_sees_a_large_temporary_allocation():
    def allocate():
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        return float(x[::4096].sum())

    # On Linux the kernel's high-water mark: exact however brief the peak. A sampler waiting 10 s
    # between samples would see only the RSS before and after (the temporary is freed by then).
    peak = peak_memory(allocate, interval=10.0)
    assert 50 < peak.mib < 200 and "VmHWM" in peak.method


def test_peak_memory_samples_where_the_kernel_keeps_no_high_water_mark(monkeypatch):
    from upzoo.bench import memory

    def allocate():
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched, held 0.2 s: 400 sampling intervals
        time.sleep(0.2)
        return float(x[::4096].sum())

    monkeypatch.setattr(memory, "_reset_high_water_mark", lambda: False)
    peak = peak_memory(allocate)
    assert 50 < peak.mib < 200 and peak.method == "CPU RSS sampled every 0.5 ms"


def test_flops_of_a_convolution():
    conv = nn.Conv2d(4, 8, 3, padding=1, bias=False)
    assert count_flops(conv, torch.zeros(1, 4, 10, 10)) == 2 * 4 * 8 * 9 * 100


@pytest.mark.slow
def test_bench_blocks_rows():
    from upzoo.registry import list_upsamplers

    rows = bench_blocks((1, 8, 16, 16), runs=2, names=list_upsamplers(kind="upsampler"))  # with the feature blocks
    names = [r["block"] for r in rows]
    assert names == [
        "anyup", "carafe", "dysample", "fade", "fir", "interp_conv", "interpolate", "jafar", "jbu", "loftup",
        "modulated", "pixel_shuffle", "sapa", "separable_transposed", "transposed", "zero_insertion",
    ]  # fmt: skip
    row = {r["block"]: r for r in rows}
    assert row["fade"]["params"] > 0 and row["sapa"]["fwd_bwd_ms"] > 0  # guided blocks get a fixed smooth guide
    assert row["interpolate"]["params"] == 0 and row["interpolate"]["gflops"] == 0
    assert row["pixel_shuffle"]["checkerboard"] == 0 and row["transposed"]["fwd_bwd_ms"] > 0
    feature_blocks = ("anyup", "jafar", "jbu", "loftup")  # image-guided: 2D only
    names_3d = [n for n in names if n not in (*feature_blocks, "modulated")]  # modulated: 2D only
    assert [r["block"] for r in bench_blocks((1, 4, 4, 8, 8), runs=1)] == names_3d


_cli = run_cli


@pytest.mark.slow
def test_bench_commands(tmp_path):
    result = _cli("bench", "blocks", "--shape", "1x4x8x8", "--runs", "1", "--json")
    assert result.returncode == 0, result.stderr
    assert {r["block"] for r in json.loads(result.stdout)} >= {"transposed", "carafe"}
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(small_recipe(tmp_path / "cache", train={"max_steps": 2})))
    result = _cli("bench", "model", str(recipe), "--runs", "2", "--json")
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout)
    assert measured["fps"] > 0 and measured["input"] == [1, 3, 32, 32] and "peak_train_checkpointing_mib" in measured
    out = tmp_path / "cmp"
    variants = "transposed,interp_conv:mode=bilinear"
    args = ["--upsamplers", variants, "--seeds", "2", "--rounds", "3", "--out", str(out), "--no-progress"]
    result = _cli("bench", "compare", str(recipe), *args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| transposed |" in result.stdout and "| interp_conv mode=bilinear |" in result.stdout
    assert re.search(r"\| ms / image \(\d+x\d+\) \|", result.stdout)  # the size the speed was measured at
    assert "2 seed(s) per variant: the 95 % intervals use Student's t with 1 degree(s) of freedom" in result.stderr
    assert (out / "compare.png").is_file() and (out / "transposed" / "seed1" / "last.pt").is_file()
    rows = json.loads((out / "compare.json").read_text())
    assert [r["upsampler"] for r in rows] == ["transposed", "interp_conv mode=bilinear"]
    first, second = rows
    assert len(first["miou_per_seed"]) == 2 and "miou_diff" not in first and "thin_iou_mean" in first
    expected = [a - b for a, b in zip(second["miou_per_seed"], first["miou_per_seed"])]
    assert second["miou_diff"] == pytest.approx(sum(expected) / 2)
    assert second["miou_beyond"] == (second["miou_diff_low"] > 0 or second["miou_diff_high"] < 0)
    assert first["ms_q1"] <= first["ms"] <= first["ms_q3"] and first["fps"] == pytest.approx(1000 / first["ms"])
    stamp = (out / "transposed" / "seed1" / "last.pt").stat().st_mtime_ns
    again = _cli("bench", "compare", str(recipe), *args)  # finished seeds are reused, not trained again
    assert again.returncode == 0, again.stderr[-2000:]
    assert (out / "transposed" / "seed1" / "last.pt").stat().st_mtime_ns == stamp
    assert [r["miou_per_seed"] for r in json.loads((out / "compare.json").read_text())] == [
        r["miou_per_seed"] for r in rows
    ]
    bad = _cli("bench", "compare", str(recipe), "--upsamplers", "transposd")
    assert bad.returncode == 1 and "did you mean 'transposed'" in bad.stderr
    bad = _cli("bench", "compare", str(recipe), "--upsamplers", "transposed", "--baseline", "carafe")
    assert bad.returncode == 1 and "--baseline 'carafe' is not one of the variants: transposed" in bad.stderr
    assert _cli("bench", "blocks", "--device", "cuda").returncode == (0 if torch.cuda.is_available() else 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_measurements_use_the_allocator_statistics():
    peak = peak_memory(lambda: torch.ones(2**24, device="cuda"), device="cuda")
    assert peak.method == "torch.cuda.max_memory_allocated" and peak.mib >= 63
    assert measure_fps(nn.Conv2d(3, 3, 3).cuda(), (2, 3, 64, 64), device="cuda", iters=3)["fps"] > 0


@pytest.mark.slow
def test_the_gpu_record_script_runs_every_section(tmp_path):
    """tools/bench_gpu.py in its --quick mode on the CPU: the script a GPU session runs once, with no
    time to debug it there, has every section working (its figures mean nothing here)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, str(root / "tools/bench_gpu.py"), "--device", "cpu", "--quick", "--steps", "4"]
    done = subprocess.run([*command, "--rounds", "2"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    for header in ("## 1. blocks", "## 2. quickstart training throughput", "## 3. torch.compile", "## 4. two-process"):
        assert header in done.stdout, done.stdout
    assert "failed" not in done.stdout, done.stdout
    assert "| sapa |" in done.stdout and "samples/s over both ranks" in done.stdout
    assert "| training step |" in done.stdout


def test_a_super_resolution_comparison_shows_bicubic_as_its_untrained_reference(tmp_path):
    from upzoo.bench.collect import _reference
    from upzoo.bench.report import display_rows, evidence_chart

    keys = ("psnr_y", "ssim_y")
    summary = {"val": {"psnr_y": 33.0, "ssim_y": 0.93, "bicubic_psnr_y": 32.07, "bicubic_ssim_y": 0.91}}
    reference = _reference("super_resolution", [summary], keys)
    assert reference == {"label": "bicubic", "psnr_y": 32.07, "ssim_y": 0.91}
    assert _reference("segmentation", [summary], keys) is None
    gan = {"val": {"swd": 45.1, "spectral_decay": -1.96, "spectral_decay_real": 1.43}}
    assert _reference("gan", [gan], ("swd", "spectral_decay")) == {"label": "the held-out real images",
                                                                   "spectral_decay": 1.43}  # fmt: skip
    row = {
        "upsampler": "pixel_shuffle",
        "seeds": 3,
        "ms": 2.0,
        "ms_q1": 1.9,
        "ms_q3": 2.1,
        "unstable": False,
        "peak_train_mib": 10,
        "params": 100,
        "gflops": 0.1,
        "input": [1, 3, 64, 96],
        "reference": reference,
    }
    for key, mean in (("psnr_y", 33.0), ("ssim_y", 0.93)):
        row |= {
            f"{key}_mean": mean,
            f"{key}_std": 0.01,
            f"{key}_ci_low": mean - 0.02,
            f"{key}_ci_high": mean + 0.02,
            f"{key}_per_seed": [mean] * 3,
        }
    table, columns = display_rows([row])
    assert "ms / image (64x96)" in columns
    assert table[-1]["upsampler"] == "bicubic (reference, not trained)" and table[-1]["PSNR Y dB"] == "32.070"
    assert table[-1]["Δ PSNR Y dB"] == "—" and table[-1]["ms / image (64x96)"] == "—"
    evidence_chart([row], tmp_path / "compare.png")
    assert (tmp_path / "compare.png").stat().st_size > 1000


def test_the_chart_stops_bounded_metrics_at_1(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from upzoo.bench.report import evidence_chart

    row = {"upsampler": "x", "seeds": 2, "ms": 2.0, "ms_q1": 1.9, "ms_q3": 2.1, "input": [1, 3, 8, 8]}
    for key, mean, half in (("psnr_y", 33.0, 0.5), ("ssim_y", 0.98, 0.07)):  # 2 seeds: an interval past 1
        row |= {f"{key}_mean": mean, f"{key}_std": 0.01, f"{key}_ci_low": mean - half,
                f"{key}_ci_high": mean + half, f"{key}_per_seed": [mean - 0.01, mean + 0.01]}  # fmt: skip
    limits = {}
    saved = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (limits.update(
        {ax.get_title(): ax.get_ylim() for ax in fig.axes}), saved(fig, *a, **k))[1])  # fmt: skip
    evidence_chart([row], tmp_path / "compare.png")
    assert limits["SSIM Y (2 seeds)"][1] == 1.0 and limits["SSIM Y (2 seeds)"][0] < 0.91
    assert limits["PSNR Y dB (2 seeds)"][1] > 33.5  # unbounded metrics keep matplotlib's margin


def test_speed_measurements_feed_images_a_frozen_backbone_accepts():
    """A probe's backbone refuses values far outside [0, 1]: the speed and memory passes of bench
    compare must feed it images in that range (they fed N(0, 1) noise and the probe comparison failed)."""
    from upzoo.bench.speed import inference_call
    from upzoo.models import build_model

    spec = {"architecture": "linear_probe", "backbone": "tf_efficientnet_lite0", "weights": "imagenet-lite",
            "layer": 3, "num_classes": 4, "upsampler": "interpolate"}  # fmt: skip
    probe = build_model(spec)
    inference_call(probe, (1, 3, 64, 64), "cpu", "none")()
    assert measure_fps(probe, (1, 3, 64, 64), iters=1, warmup=0)["fps"] > 0


def test_a_generators_speed_column_is_per_generated_image():
    """A generator is timed from a latent vector ([1, latent_dim]): the column has no image size to name."""
    from upzoo.bench.report import display_rows

    row = {"upsampler": "transposed", "seeds": 3, "ms": 1.7, "ms_q1": 1.5, "ms_q3": 3.4, "unstable": False,
           "peak_train_mib": 2, "params": 370723, "gflops": 0.01, "input": [1, 100]}  # fmt: skip
    assert "ms / generated image" in display_rows([row])[1]
    assert "ms / image (64x96)" in display_rows([row | {"input": [1, 3, 64, 96]}])[1]


def test_a_tissue_comparison_shows_the_label_free_baseline_and_the_oracle():
    from upzoo.bench.collect import _reference

    keys = ("dice", "gm_dice")
    summary = {"val": {"dice": 0.84, "gm_dice": 0.90, "kmeans_dice": 0.846, "kmeans_gm_dice": 0.872,
                       "oracle_dice": 0.864, "oracle_gm_dice": 0.917}}  # fmt: skip
    rows = _reference("through_plane_segmentation", [summary], keys)
    assert rows == [
        {"label": "label-free k-means of cubic-interpolated T1", "dice": 0.846, "gm_dice": 0.872},
        {"label": "oracle thick-grid labels (true slab majority)", "dice": 0.864, "gm_dice": 0.917},
    ]
    older = {"val": {"dice": 0.8, "gm_dice": 0.85, "thick_dice": 0.864, "thick_gm_dice": 0.917}}  # before k-means
    assert _reference("through_plane_segmentation", [older], keys) == rows[1]


def test_bench_blocks_leaves_the_feature_upsamplers_to_their_own_table_and_takes_patterns():
    from upzoo.bench.block_table import default_block_names
    from upzoo.registry import list_upsamplers

    default = default_block_names()
    assert set(list_upsamplers(kind="upsampler")) - set(default) == {"jbu", "jafar", "loftup", "anyup"}
    code, out, err = cli_streams("bench", "blocks", "--shape", "1x4x8x8", "--runs", "1", "--blocks", "pixel*,fir")
    assert code == 0 and err.count("measuring ") == 2 and "| pixel_shuffle |" in out and "| fir |" in out
    code, _, err = cli_streams("bench", "blocks", "--blocks", "nope")
    assert code == 1 and err.startswith("error: --blocks: 'nope' matches no upsampler; registered: anyup")
