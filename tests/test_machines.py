"""Every machine a user brings: the cross-entropy that is deterministic on CUDA, the deterministic
mode and its refusal before any work, torchrun's environment, one GPU per rank, the collectives on
the group's device (a real two-process gloo group), ``--devices`` and the machine record that goes
with every figure. No GPU is needed: CUDA's answers are monkeypatched where a rule depends on them."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from conftest import small_recipe
from upzoo.errors import ConfigError


# -- the loss ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_equals_pytorchs_in_values_and_gradients(weighted):
    from upzoo.train.tasks import cross_entropy

    logits = torch.randn(3, 5, 6, 7, dtype=torch.float64)
    target = torch.randint(0, 5, (3, 6, 7))
    target[0, :2] = 255  # ignored pixels
    weight = torch.rand(5, dtype=torch.float64) + 0.5 if weighted else None
    mine = logits.clone().requires_grad_()
    theirs = logits.clone().requires_grad_()
    got = cross_entropy(mine, target, weight=weight, ignore_index=255)
    expected = F.cross_entropy(theirs, target, weight=weight, ignore_index=255)
    got.backward()
    expected.backward()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-10, atol=1e-14)


def test_cross_entropy_of_an_all_ignored_batch_is_nan_as_pytorchs():
    from upzoo.train.tasks import cross_entropy

    logits = torch.randn(1, 3, 2, 2, dtype=torch.float64)
    target = torch.full((1, 2, 2), 255)
    assert torch.isnan(cross_entropy(logits, target)) and torch.isnan(F.cross_entropy(logits, target, ignore_index=255))


# -- deterministic mode ---------------------------------------------------------------------------------
def _model(block: str, **options) -> torch.nn.Module:
    from upzoo.models.unet import UNet

    return UNet(spatial_dims=2, in_channels=3, num_classes=4, channels=(4, 8), upsampler=block,
                upsampler_options=options or None)  # fmt: skip


def test_the_ops_without_a_deterministic_cuda_kernel_are_found_with_their_module():
    from upzoo.train.determinism import nondeterministic_cuda_ops

    found = nondeterministic_cuda_ops(_model("dysample"), (2, 3, 32, 32))
    assert any("(dysample)" in where for where in found), found
    assert all(ops == ["grid_sample"] for ops in found.values()), found
    found = nondeterministic_cuda_ops(_model("interpolate", mode="bilinear"), (2, 3, 32, 32))
    assert found and all("bilinear interpolation" in ops for ops in found.values()), found
    assert nondeterministic_cuda_ops(_model("interpolate", mode="nearest"), (2, 3, 32, 32)) == {}
    for clean in ("transposed", "pixel_shuffle", "carafe"):
        assert nondeterministic_cuda_ops(_model(clean), (2, 3, 32, 32)) == {}, clean


def test_a_deterministic_cuda_run_is_refused_before_any_work_and_the_cpu_is_not():
    from upzoo.train.determinism import check_deterministic

    modules, shapes = {"model": _model("dysample")}, {"model": ((2, 3, 32, 32),)}
    with pytest.raises(ConfigError) as caught:
        check_deterministic(modules, shapes, torch.device("cuda", 0))
    message = str(caught.value)
    assert "\n" not in message and "(dysample) uses grid_sample" in message
    assert "train.deterministic: false" in message and "pixel_shuffle" in message
    check_deterministic(modules, shapes, torch.device("cpu"))  # every CPU kernel is deterministic
    check_deterministic({"model": _model("carafe")}, shapes, torch.device("cuda", 0))


def test_deterministic_mode_is_set_for_the_run_and_put_back_after_it(tmp_path):
    from upzoo.train.engine import train

    seen = []
    before = torch.are_deterministic_algorithms_enabled()

    from upzoo.recipe import parse_recipe

    recipe = parse_recipe(small_recipe(str(tmp_path / "cache"), train={"deterministic": True}))
    summary = train(recipe, tmp_path / "run", progress=False, on_step=lambda *a: seen.append(
        (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)))  # fmt: skip
    assert seen == [(True, False)]
    assert torch.are_deterministic_algorithms_enabled() == before
    assert summary["deterministic"] is True
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability().lower()
    assert written["machine"]["device"] == "cpu" and written["machine"]["threads"] == torch.get_num_threads()


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_train_deterministic_takes_true_or_false_only(tmp_path, value):

    from upzoo.recipe import parse_recipe

    with pytest.raises(ConfigError, match=r"train\.deterministic") as caught:
        parse_recipe(small_recipe(str(tmp_path), train={"deterministic": value}))
    assert "\n" not in str(caught.value) and "true or false" in str(caught.value)


# -- torchrun's environment and one GPU per rank --------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LOCAL_RANK": "0"}, "LOCAL_RANK='0' is set but WORLD_SIZE is not"),
        ({"RANK": "1"}, "RANK='1' is set but WORLD_SIZE is not"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two': expected a whole number >= 1"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0': expected a whole number >= 1"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, r"RANK='2': expected a whole number in \[0, 1\]"),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "-1"}, "LOCAL_RANK='-1'"),
    ],
)
def test_torchruns_environment_is_checked_before_any_work(monkeypatch, env, message):
    from upzoo.train.distributed import distributed_environment

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message) as caught:
        distributed_environment()
    assert "\n" not in str(caught.value) and "torchrun" in str(caught.value)


def test_the_environment_of_a_rank_and_of_a_single_process(monkeypatch):
    from upzoo.train.distributed import distributed_environment

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed_environment() == (0, 1, 0)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed_environment() == (3, 4, 1)


def _two_gpus(monkeypatch) -> list[int]:
    selected: list[int] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", selected.append)
    return selected


def test_each_rank_takes_its_own_gpu_and_no_more_ranks_than_gpus(monkeypatch):
    from upzoo.train.distributed import check_nproc, rank_device

    selected = _two_gpus(monkeypatch)
    assert rank_device(torch.device("cuda"), 1) == torch.device("cuda", 1) and selected == [1]
    assert rank_device(torch.device("cpu"), 1) == torch.device("cpu") and selected == [1]
    with pytest.raises(ConfigError, match="LOCAL_RANK=2 needs CUDA device 2, but only 2 are visible"):
        rank_device(torch.device("cuda"), 2)
    check_nproc(2, torch.device("cuda"))
    check_nproc(8, torch.device("cpu"))  # CPU processes share the cores
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    visible = r"--nproc 3 .* 2 CUDA device\(s\) are visible here \(CUDA_VISIBLE_DEVICES=0,1\)"
    with pytest.raises(ConfigError, match=visible):
        check_nproc(3, torch.device("cuda"))


@pytest.mark.parametrize(("device", "backend"), [("cpu", "gloo"), ("cuda", "cpu:gloo,cuda:nccl")])
def test_the_process_group_reduces_cpu_tensors_on_every_device(monkeypatch, device, backend):
    import torch.distributed as dist

    from upzoo.train import distributed

    _two_gpus(monkeypatch)
    asked = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend: asked.append(backend))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    ctx = distributed.init_distributed(torch.device(device))
    assert asked == [backend]
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.owns_group) == (1, 2, 1, True)
    assert ctx.device == (torch.device("cuda", 1) if device == "cuda" else torch.device("cpu"))


def test_collectives_across_two_real_gloo_processes():
    from gloo_workers import collectives_worker, run_two_ranks

    results = run_two_ranks(collectives_worker)
    for rank in (0, 1):
        got = results[rank]
        assert got["device"] == "cpu"
        assert got["sum"] == [3, 6, 9] and got["max"] == [1.0, 0.0]
        assert got["gather"] == [10.0, 11.0] and got["mean"] == 0.5
        assert got["any"] is True and got["none"] is False and got["in_sync"] is True
        assert got["differ"].startswith("TrainingError: DDP ranks hold different parameters")


def test_in_a_single_process_the_collectives_change_nothing():
    from upzoo.collectives import all_gather_floats, all_reduce_max, all_reduce_sum, distributed_active

    assert not distributed_active()
    tensor = torch.tensor([1.0, 2.0])
    assert all_reduce_sum(tensor) is tensor and tensor.tolist() == [1.0, 2.0]
    assert all_reduce_max(tensor).tolist() == [1.0, 2.0] and all_gather_floats(3.5) == [3.5]


# -- --devices -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("abc", "'abc' is not a GPU number"),
        ("0,,1", "'' is not a GPU number"),
        ("0,1,0", "a GPU named twice"),
        ("-1", "'-1' is not a GPU number"),
    ],  # fmt: skip
)
def test_devices_must_be_distinct_gpu_numbers(text, message):
    from upzoo.bench.launchers import parse_devices

    with pytest.raises(ConfigError, match=message):
        parse_devices(text)


def test_devices_give_each_worker_its_own_gpus(monkeypatch):
    from upzoo.bench.launchers import _worker_env, check_devices, parse_devices

    assert parse_devices(None) is None and parse_devices(" 0, 1 ") == ["0", "1"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="no CUDA device is available here; leave --devices out"):
        check_devices(["0"], 1, 1)
    _two_gpus(monkeypatch)
    with pytest.raises(ConfigError, match=r"names GPU 7, but this machine has 2 \(0-1\)"):
        check_devices(["7", "1"], 2, 1)
    with pytest.raises(ConfigError, match=r"--jobs 3 x --nproc 1 use 3 GPU\(s\).* names 2 \(0,1\)"):
        check_devices(["0", "1"], 3, 1)
    check_devices(["0", "1"], 1, 2)
    check_devices(None, 5, 1)
    assert _worker_env(1, 2, ["0", "1"], 1)["CUDA_VISIBLE_DEVICES"] == "1"
    assert _worker_env(0, 1, ["0", "1"], 2)["CUDA_VISIBLE_DEVICES"] == "0,1"
    threads = _worker_env(0, 2, None, 1)["OMP_NUM_THREADS"]
    assert threads == str(max(1, (os.cpu_count() or 1) // 2))


# -- the machine record ----------------------------------------------------------------------------------
def test_the_machine_record_names_what_a_figure_depends_on(monkeypatch):
    from upzoo.machine import machine_kind, machine_record

    record = machine_record("cpu")
    assert record["cpu_capability"] == torch.backends.cpu.get_cpu_capability().lower()
    assert record["torch"] == torch.__version__ and record["threads"] == torch.get_num_threads()
    assert record["cores"] == os.cpu_count() and record["device"] == "cpu" and "gpu" not in record
    assert machine_kind(record) == f"{record['cpu']} [{record['cpu_capability']}]"
    assert machine_kind({**record, "gpu": "NVIDIA H200", "cuda": "13.0"}) == "NVIDIA H200 (CUDA 13.0)"


def test_a_comparison_over_several_kinds_of_machine_says_so():
    from upzoo.bench.collect import cells_machines, machine_note

    epyc = {"cpu": "AMD EPYC", "cpu_capability": "avx512", "threads": 2}
    xeon = {"cpu": "Intel Xeon", "cpu_capability": "avx512", "threads": 2}
    a = cells_machines([{"machine": epyc, "seconds": 10.0, "deterministic": True}] * 2)
    b = cells_machines([{"machine": xeon, "seconds": 4.0, "deterministic": True},
                        {"machine": epyc, "seconds": 8.0, "deterministic": False}])  # fmt: skip
    assert a == {"machines": ["AMD EPYC [avx512]"], "threads": [2], "deterministic": True,
                 "train_seconds_by_machine": {"AMD EPYC [avx512]": 10.0}}  # fmt: skip
    assert b["deterministic"] == "mixed"
    assert b["train_seconds_by_machine"] == {"AMD EPYC [avx512]": 8.0, "Intel Xeon [avx512]": 4.0}
    note = machine_note([{"variant": "a", **a}, {"variant": "b", **b}])
    assert "2 kinds of machine (AMD EPYC [avx512]; Intel Xeon [avx512])" in note and "threads" not in note
    assert machine_note([{"variant": "a", **a}]) == ""


def test_a_comparison_whose_cells_trained_with_other_thread_counts_says_so():
    """One seed of the quick DCGAN recipe gives losses that differ at step 10 with 1 and 2 threads
    (1e-4) and generators whose FD differs after 2,500 steps: the collected table says so."""
    from upzoo.bench.collect import cells_machines, machine_note

    epyc = {"cpu": "AMD EPYC", "cpu_capability": "avx512"}
    one = cells_machines([{"machine": {**epyc, "threads": 1}, "seconds": 10.0}] * 2)
    mixed = cells_machines([{"machine": {**epyc, "threads": 2}, "seconds": 8.0},
                            {"machine": {**epyc, "threads": 1}, "seconds": 9.0},
                            {"machine": epyc, "seconds": 7.0}])  # fmt: skip
    assert one["threads"] == [1] and mixed["threads"] == [1, 2]
    assert machine_note([{"variant": "a", **one}]) == ""
    note = machine_note([{"variant": "a", **one}, {"variant": "b", **mixed}])
    assert note.startswith("the cells trained with 1 and 2 CPU threads: a seed repeats") and "kinds" not in note


def test_the_comparison_table_says_where_its_numbers_came_from():
    from upzoo.bench.report import machine_lines

    rows = [
        {
            "train_seconds_by_machine": {"AMD EPYC [avx512]": 100.0},
            "deterministic": True,
            "speed_machine": "Xeon",
            "threads": [2],
        },
        {
            "train_seconds_by_machine": {"AMD EPYC [avx512]": 50.0, "Intel Xeon [avx2]": 30.0},
            "deterministic": False,
            "threads": [1, 2],
        },
    ]
    assert machine_lines(rows).splitlines() == [
        "- trained on: AMD EPYC [avx512] (mean 75 s per cell)",
        "- trained on: Intel Xeon [avx2] (mean 30 s per cell)",
        "- CPU threads per cell: 1, 2",
        "- deterministic cells: False, True",
        "- speed and memory measured on: Xeon",
    ]
    assert machine_lines([{}])[: len("- trained on: not recorded")] == "- trained on: not recorded"


def test_instruction_sets_come_from_the_cpus_own_flags():
    from upzoo.machine import cpu_flags, instruction_sets

    epyc = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_1 avx2 fma avx512f avx512_bf16 avx512vl\n"
    sapphire = "flags\t\t: avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
    older = "flags\t\t: sse4_1 avx avx2 fma\n"
    graviton = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes\n"
    assert instruction_sets(cpu_flags(epyc)) == ["avx2", "avx512", "avx512_bf16"]
    assert instruction_sets(cpu_flags(sapphire)) == ["avx2", "avx512", "avx512_bf16", "amx"]
    assert instruction_sets(cpu_flags(older)) == ["avx2"]
    assert instruction_sets(cpu_flags(graviton)) == ["neon"]
    assert instruction_sets(cpu_flags("no flags here")) == []


def test_upzoo_device_prints_the_machine_record_and_the_defaults(monkeypatch):
    from conftest import run_cli
    from upzoo.machine import instruction_sets, machine_record

    result = run_cli("device", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["machine"]["isa"] == instruction_sets() and report["machine"]["cpu"] == machine_record()["cpu"]
    assert report["runtimes"]["onnxruntime"] == __import__("onnxruntime").__version__
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert report["defaults"]["train"]["device"] == report["defaults"]["predict"]["device"] == expected
    native = bool({"avx512_bf16", "amx"} & set(instruction_sets())) or torch.cuda.is_available()
    assert report["defaults"]["train"]["bf16_native"] is native
    text = run_cli("device").stdout
    assert text.startswith("CPU          ") and "instructions AVX2 " in text and "predict      device" in text
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = json.loads(run_cli("device", "--json").stdout)
    assert capped["defaults"]["train"]["bf16_native"] is (native and torch.cuda.is_available())
