"""Comparisons that outgrow one machine: a plan of cells (variant x seed), launched in this process,
on local worker processes or as a Slurm array through submitit (its local executor here, no
cluster), and collected from the run folders — the same table whichever way the cells ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import run_cli, small_recipe
from upzoo.bench.collect import collect_comparison
from upzoo.bench.launchers import SlurmOptions, launch_local, launch_slurm, sbatch_preview, slurm_executor
from upzoo.bench.plan import JOBS_FILE, plan_comparison, read_plan, write_plan
from upzoo.bench.variants import parse_variants
from upzoo.errors import ConfigError
from upzoo.recipe import parse_recipe
from upzoo.runtime import FolderLock
from upzoo.train.engine import train


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scaling-cache")


def _recipe(cache: Path, **train_options):
    return parse_recipe(small_recipe(cache, train={"max_steps": 2, **train_options}))


def _plan(cache: Path, out: Path, variants: str = "transposed,interpolate", seeds: int = 2, **train_options):
    plan = plan_comparison(_recipe(cache, **train_options), parse_variants(variants), out, seeds=seeds)
    write_plan(plan, out)
    return plan


def _per_seed(rows) -> dict[str, list[float]]:
    return {row["upsampler"]: row["miou_per_seed"] for row in rows}


def test_plan_only_writes_the_plan_and_one_job_line_per_cell(cache, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(small_recipe(cache, train={"max_steps": 2})))
    out = tmp_path / "cmp"
    args = ["--upsamplers", "transposed,interpolate", "--seeds", "2", "--out", out, "--plan-only"]
    slurm = ["--launcher", "slurm", "--partition", "gpu", "--cpus-per-cell", "4", "--time", "30"]
    slurm += ["--array-parallelism", "2", "--sbatch", "account=lab"]
    result = run_cli("bench", "compare", recipe, *args, *slurm)
    assert result.returncode == 0, result.stderr
    plan = read_plan(out)
    assert [(c.variant, c.seed) for c in plan.cells] == [("transposed", 0), ("transposed", 1), ("interpolate", 0),
                                                         ("interpolate", 1)]  # fmt: skip
    lines = (out / JOBS_FILE).read_text().splitlines()
    assert len(lines) == 4 and all(" train " in line and "--continue" in line for line in lines)
    assert lines[0].startswith("mkdir -p logs && upzoo train recipes/transposed-seed0.yaml --out transposed/seed0 ")
    assert str(tmp_path) not in (out / "plan.json").read_text() and (out / "slurm").is_dir()
    assert not list(out.rglob("summary.json"))  # nothing trained
    script = (out / "slurm.sbatch").read_text()
    for fragment in ("#SBATCH --array=0-3%2", "#SBATCH --partition=gpu", "#SBATCH --cpus-per-task=4",
                     "#SBATCH --time=30", "#SBATCH --account=lab", "#SBATCH --gpus-per-node=1"):  # fmt: skip
        assert fragment in script, (fragment, script)
    collected = run_cli("bench", "collect", out, "--rounds", "3")
    missing = [line for line in collected.stderr.splitlines() if line.startswith("missing: ")]
    assert collected.returncode == 1 and len(missing) == 4 and "not run yet" in missing[0]


@pytest.mark.slow  # 5 s: a training in a new interpreter, as a scheduler starts it
def test_any_scheduler_can_run_a_job_line_and_collect_reports_what_is_missing(cache, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(small_recipe(cache, train={"max_steps": 2})))
    out = tmp_path / "cmp"
    args = ["--upsamplers", "transposed,interpolate", "--seeds", "2", "--out", out, "--plan-only"]
    assert run_cli("bench", "compare", recipe, *args).returncode == 0
    moved = tmp_path / "elsewhere" / "cmp"  # a comparison folder copied to a cluster, or moved: it still works
    moved.parent.mkdir()
    out.rename(moved)
    out = moved
    lines = (out / JOBS_FILE).read_text().splitlines()
    (out / "logs").rmdir()  # copied without its empty folders (git, a file-by-file copy): the line makes it
    assert subprocess.run(["bash", "-c", lines[0]], env=dict(os.environ), cwd=out).returncode == 0
    assert (out / "transposed" / "seed0" / "summary.json").is_file()
    collected = run_cli("bench", "collect", out, "--rounds", "3")
    missing = [line for line in collected.stderr.splitlines() if line.startswith("missing: ")]
    assert collected.returncode == 1 and len(missing) == 3 and "not run yet" in missing[0]
    rows = json.loads((out / "compare.json").read_text())
    assert [(r["upsampler"], r["seeds"], r["planned_seeds"]) for r in rows] == [("transposed", 1, 2)]
    assert "1 of 2" in (out / "compare.md").read_text()


@pytest.mark.slow  # 25 s: four trainings twice
def test_two_local_workers_give_the_table_of_a_sequential_run(cache, tmp_path):
    sequential, parallel = _plan(cache, tmp_path / "seq"), _plan(cache, tmp_path / "par")
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))  # as each of the two workers gets: the same ops
    try:
        assert all(r.status == "done" for r in launch_local(sequential, jobs=1, echo=lambda _: None, progress=False))
    finally:
        torch.set_num_threads(threads)
    lines: list[str] = []
    results = launch_local(parallel, jobs=2, echo=lines.append, progress=False)
    assert all(r.status == "done" for r in results), [r.error for r in results]
    assert (
        sum(line.startswith("start ") for line in lines) == 4 and sum(line.startswith("done ") for line in lines) == 4
    )
    rows_seq, missing_seq = collect_comparison(tmp_path / "seq", rounds=3)
    rows_par, missing_par = collect_comparison(tmp_path / "par", rounds=3)
    assert not missing_seq and not missing_par
    assert _per_seed(rows_par) == _per_seed(rows_seq)  # same ops, same thread count: the same CPU training


@pytest.mark.slow  # 15 s: a worker start-up, a kill and a retry
def test_a_killed_cell_is_reported_failed_retried_and_continues_from_last_pt(cache, tmp_path):
    import psutil

    steps = 300  # each a checkpoint written and fsynced: seconds of work after the first one

    plan = _plan(cache, tmp_path / "cmp", variants="interpolate", seeds=1, max_steps=steps, checkpoint_every=1,
                 log_every=1)  # fmt: skip
    cell = plan.cells[0]
    killed: list[int] = []

    def kill_after_first_checkpoint() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            if (Path(cell.folder) / "last.pt").is_file():
                for child in psutil.Process().children(recursive=True):
                    if "upzoo.bench.worker" in " ".join(child.cmdline()):  # the worker training the cell
                        os.kill(child.pid, signal.SIGKILL)
                        killed.append(child.pid)
            time.sleep(0.002)  # the cell has `steps` checkpointed steps to go: far more than one poll on any machine

    watcher = threading.Thread(target=kill_after_first_checkpoint)
    watcher.start()
    lines: list[str] = []
    (result,) = launch_local(plan, jobs=2, retries=1, echo=lines.append, progress=False)
    watcher.join()
    assert killed and any(line.startswith("failed interpolate seed 0") for line in lines), lines
    assert any(line.startswith("retry 1 of 1") for line in lines) and result.status == "done" and result.attempts == 2
    summary = json.loads((Path(cell.folder) / "summary.json").read_text())
    assert summary["steps"] == steps and not summary["interrupted"]
    assert f'"steps": {steps}' in Path(cell.log).read_text()  # the retry's output (each attempt rewrites the log)
    assert "killed by SIGKILL" in next(line for line in lines if line.startswith("failed"))  # its signal, named
    import csv

    with open(Path(cell.folder) / "metrics.csv", newline="") as f:
        logged = [int(row["step"]) for row in csv.DictReader(f) if row["loss"]]
    assert logged == list(range(1, steps + 1))  # resumed from last.pt: no step lost, none twice


def test_a_cell_folder_holding_another_recipes_run_is_refused(cache, tmp_path):
    plan = _plan(cache, tmp_path / "cmp", variants="interpolate", seeds=1)
    train(_recipe(cache, lr=0.5), plan.cells[0].folder, progress=False)
    (result,) = launch_local(plan, jobs=1, echo=lambda _: None, progress=False)
    assert (
        result.status == "failed"
        and "holds a run of another recipe (model.upsampler: None there, 'interpolate' here)" in result.error
    )


def test_two_launches_into_one_dir_do_not_run_a_cell_twice(cache, tmp_path):
    plan = _plan(cache, tmp_path / "cmp", variants="interpolate", seeds=1)
    folder = Path(plan.cells[0].folder)
    with FolderLock(folder, "held by the other launch"):  # another launch is training this cell
        (result,) = launch_local(plan, jobs=1, echo=lambda _: None, progress=False)
    assert result.status == "failed" and "is in use by another run" in result.error
    assert not (folder / "last.pt").exists()


@pytest.mark.parametrize(
    ("options", "difference"),
    [
        ({"lr": 0.5}, "another base recipe (a changed recipe file or --set)"),
        (
            {"variants": "interpolate,transposed"},
            "variants ['interpolate', 'transposed'] (the plan there: ['interpolate'])",
        ),
        ({"seeds": 2}, "seeds [0, 1] (the plan there: [0])"),
    ],
)
def test_a_plan_in_dir_refuses_another_comparison(cache, tmp_path, options, difference):
    from upzoo.errors import ConfigError

    first = _plan(cache, tmp_path / "cmp", variants="interpolate", seeds=1)
    before = {p: p.read_bytes() for p in (tmp_path / "cmp").rglob("*") if p.is_file()}
    options = {"variants": "interpolate", "seeds": 1, **options}
    with pytest.raises(ConfigError, match="holds another comparison's plan") as info:
        _plan(cache, tmp_path / "cmp", **options)
    assert difference in str(info.value)
    assert {p: p.read_bytes() for p in (tmp_path / "cmp").rglob("*") if p.is_file()} == before  # nothing replaced
    assert _plan(cache, tmp_path / "cmp", variants="interpolate", seeds=1).cells == first.cells  # the same plan again


def test_a_plan_goes_only_into_an_empty_folder_or_its_own(cache, tmp_path):
    from upzoo.errors import ConfigError

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    with pytest.raises(ConfigError, match="mine is not empty \\(notes.txt\\) and holds no comparison plan"):
        _plan(cache, tmp_path / "mine", variants="interpolate", seeds=1)
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


@pytest.mark.slow  # 15 s: submitit starts a process per job
def test_the_slurm_path_runs_end_to_end_on_submitit_s_local_executor(cache, tmp_path):
    plan = _plan(cache, tmp_path / "cmp", variants="interpolate", seeds=2)
    options = SlurmOptions(partition="gpu", gpus=0, cpus=1, time_min=10, parallelism=2)
    executor = slurm_executor(tmp_path / "cmp" / "slurm", options, cluster="local")
    lines: list[str] = []
    results = launch_slurm(plan, executor, threads=1, echo=lines.append)
    assert all(r.status == "done" for r in results), [r.error for r in results]
    assert lines[0].startswith("submitted 2 cell(s) as a job array")
    rows, missing = collect_comparison(tmp_path / "cmp", rounds=3)
    assert not missing and rows[0]["seeds"] == 2
    script = sbatch_preview(plan, SlurmOptions(partition="gpu", cpus=1, parallelism=2), tmp_path / "cmp" / "slurm")
    assert "#SBATCH --array=0-1%2" in script


def test_an_edited_cell_is_refused_by_continue_and_by_collect_alike(tmp_path):
    """The one identity rule: ``train --continue`` (runs.state) and ``bench collect`` name the same
    first difference for a run folder whose recipe differs from its cell's."""
    import yaml

    from upzoo.bench.collect import cell_outcome
    from upzoo.bench.plan import Cell
    from upzoo.prepare import prepare
    from upzoo.recipe import parse_recipe, plain
    from upzoo.runs.state import run_state

    recipe = parse_recipe(small_recipe(tmp_path / "cache"))
    folder = tmp_path / "cell"
    folder.mkdir()
    edited = plain(recipe.to_dict())
    edited["train"]["lr"] = 0.5
    (folder / "recipe.yaml").write_text(yaml.safe_dump(edited))
    (folder / "last.pt").write_bytes(b"")
    cell_recipe = tmp_path / "cell.yaml"
    cell_recipe.write_text(yaml.safe_dump(plain(recipe.to_dict())))
    cell = Cell(variant="v", seed=0, recipe_file=str(cell_recipe), recipe_hash="", folder=str(folder),
                log=str(tmp_path / "v.log"))  # fmt: skip
    summary, reason = cell_outcome(cell)
    with pytest.raises(ConfigError) as refused:
        run_state(folder, prepare(recipe))
    difference = "train.lr: 0.5 there, 0.001 here"
    assert summary is None and difference in reason and difference in str(refused.value)


@pytest.mark.slow  # two cells of 60 steps, one of them twice
def test_ctrl_c_stops_an_in_process_comparison_at_a_step_and_it_continues_later(cache, tmp_path):
    plan = _plan(cache, tmp_path / "cmp", variants="interpolate", seeds=2, max_steps=60, log_every=1)
    first = Path(plan.cells[0].folder)

    def interrupt_after_a_few_steps() -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            metrics = first / "metrics.csv"
            if metrics.is_file() and len(metrics.read_text().splitlines()) > 2:
                os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=interrupt_after_a_few_steps)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        launch_local(plan, jobs=1, echo=lambda line: None, progress=False)
    watcher.join()
    summary = json.loads((first / "summary.json").read_text())
    assert summary["interrupted"] and 0 < summary["steps"] < 60 and (first / "last.pt").is_file()
    assert not Path(plan.cells[1].folder).exists()  # the second cell never started
    results = launch_local(plan, jobs=1, echo=lambda line: None, progress=False)  # the same command again
    assert [r.status for r in results] == ["done", "done"]
    assert json.loads((first / "summary.json").read_text())["steps"] == 60


@pytest.mark.slow
def test_a_bug_in_an_in_process_cell_fails_that_cell_with_its_traceback_and_the_rest_runs(cache, tmp_path, monkeypatch):
    import upzoo.train.engine as engine

    plan = _plan(cache, tmp_path / "cmp", variants="interpolate", seeds=2, max_steps=1)
    real_train, calls = engine.train, []

    def train_with_a_bug(recipe, folder, **kwargs):
        calls.append(folder)
        if len(calls) == 1:
            raise ZeroDivisionError("a bug in the first cell")
        return real_train(recipe, folder, **kwargs)

    monkeypatch.setattr(engine, "train", train_with_a_bug)
    results = launch_local(plan, jobs=1, echo=lambda line: None, progress=False)
    assert [r.status for r in results] == ["failed", "done"]
    assert results[0].error.startswith("unexpected ZeroDivisionError: a bug in the first cell (traceback in ")
    log = Path(plan.cells[0].log).read_text()
    assert "Traceback (most recent call last)" in log and "ZeroDivisionError" in log
    _, missing = collect_comparison(tmp_path / "cmp", rounds=3)
    assert missing[0]["reason"] == "error: unexpected ZeroDivisionError: a bug in the first cell"


class _FakeSlurm:
    """A submitit-like executor whose jobs fail once per cell, then succeed (no process, no training)."""

    def __init__(self):
        self.submitted: list[str] = []

    def batch(self):
        import contextlib

        return contextlib.nullcontext()

    def submit(self, job):
        folder = job.cell.folder
        failed_before = folder in self.submitted
        self.submitted.append(folder)
        outcome = {"status": "done", "seconds": 1.0} if failed_before else {"status": "failed", "error": "node lost"}

        class Job:
            job_id = f"42_{len(self.submitted)}"

            def result(self):
                return outcome

        return Job()


def test_the_slurm_launcher_retries_failed_cells_with_the_one_retry_loop(cache, tmp_path):
    plan = _plan(cache, tmp_path / "cmp", variants="interpolate", seeds=2)
    lines: list[str] = []
    executor = _FakeSlurm()
    results = launch_slurm(plan, executor, threads=1, retries=1, echo=lines.append)
    assert [(r.status, r.attempts) for r in results] == [("done", 2), ("done", 2)]
    assert len(executor.submitted) == 4 and any(line.startswith("retry 1 of 1: 2 failed cell(s)") for line in lines)
    failed = launch_slurm(plan, _FakeSlurm(), threads=1, retries=0, echo=lines.append)
    assert [(r.status, r.attempts, r.error) for r in failed] == [("failed", 1, "node lost")] * 2
