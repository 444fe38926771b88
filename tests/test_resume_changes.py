"""Resume keeps its word: a changed train key takes effect (the optimiser's saved hyperparameters
included) or is refused in one line, the run folder's recipe of record follows the run, a change of
channels under ``strides: auto`` is a difference, and one rule of equality decides both the
comparison and the digest."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from conftest import run_cli, small_recipe, small_volume_recipe
from upzoo.errors import ConfigError
from upzoo.prepare import prepare
from upzoo.recipe import parse_recipe
from upzoo.runs.identity import differences, first_difference, recipe_digest
from upzoo.runs.state import run_state
from upzoo.train.engine import train
from upzoo.train.optim import build_scheduler
from upzoo.train.resume import resume_recipe


@pytest.fixture
def short_run(tmp_path):
    """A 2-step segmentation run (AdamW, lr 0.01, poly) and the file of its recipe."""
    recipe = small_recipe(
        tmp_path / "cache", train={"max_steps": 2, "lr": 0.01, "weight_decay": 0.0001, "log_every": 1}
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    train(parse_recipe(recipe), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / ".lock").exists()  # the lock goes with the run: no empty file stays behind
    return tmp_path / "run", path


def test_changed_train_keys_take_effect_and_the_folder_records_them(short_run):
    run, recipe_file = short_run
    sets = ["train.max_steps=4", "train.lr=0.02", "train.weight_decay=0.003", "train.betas=[0.8,0.99]"]
    result = run_cli("train", "--resume", run, "--no-progress", *[a for s in sets for a in ("--set", s)])
    assert result.returncode == 0, result.stderr
    assert f"resuming {run} at step 2 with: train.betas: [0.9, 0.999] there, [0.8, 0.99] here; " in result.stderr
    assert "train.lr: 0.01 there, 0.02 here; train.max_steps: 2 there, 4 here" in result.stderr

    stored = yaml.safe_load((run / "recipe.yaml").read_text())
    assert stored["train"]["max_steps"] == 4 and stored["train"]["lr"] == 0.02
    identity = json.loads((run / "run.json").read_text())
    assert identity["recipe_sha256"] == recipe_digest(stored)
    [change] = identity["recipe_changes"]
    assert change["step"] == 2 and "train.weight_decay: 0.0001 there, 0.003 here" in change["changes"]

    state = torch.load(run / "last.pt", weights_only=True)
    recipe = parse_recipe(stored)
    expected_factor = build_scheduler(torch.optim.SGD([torch.zeros(1)], lr=1.0), recipe.train, 4).lr_lambdas[0](4)
    [group] = state["optimizers"]["model"]["param_groups"]
    assert group["initial_lr"] == 0.02 and group["weight_decay"] == 0.003 and tuple(group["betas"]) == (0.8, 0.99)
    assert group["lr"] == pytest.approx(0.02 * expected_factor)
    lrs = {int(r["step"]): float(r["lr"]) for r in _rows(run) if r["lr"]}
    factors = build_scheduler(torch.optim.SGD([torch.zeros(1)], lr=1.0), recipe.train, 4).lr_lambdas[0]
    assert lrs[3] == pytest.approx(0.02 * factors(3), rel=1e-5)  # the new rate from the first resumed step

    # the folder is credited to the recipe it ran: --continue finds the longer one done, refuses the shorter
    assert run_state(run, prepare(recipe))[0] == "done"
    with pytest.raises(ConfigError, match=r"holds a run of another recipe \(train.betas"):
        run_state(run, prepare(parse_recipe(yaml.safe_load(recipe_file.read_text()))))


@pytest.mark.parametrize(
    "change, message",
    [
        ("train.optimizer=sgd", r"train.optimizer cannot change on --resume \('adamw' there, 'sgd' here\): the saved "),
        ("train.seed=3", r"train.seed cannot change on --resume \(0 there, 3 here\): the run's random state"),
    ],
)
def test_a_change_a_resumed_run_cannot_honour_is_refused_in_one_line(short_run, change, message):
    run, _ = short_run
    before = (run / "recipe.yaml").read_text()
    with pytest.raises(ConfigError, match=message):
        resume_recipe(run, overrides=[change])
    result = run_cli("train", "--resume", run, "--set", change, "--set", "train.max_steps=3")
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    stored = yaml.safe_load(before)  # the Python API refuses it too, before a step
    key, value = change.split("=")
    stored["train"][key.split(".")[1]] = yaml.safe_load(value)
    stored["train"]["max_steps"] = 3
    with pytest.raises(ConfigError, match=message):
        train(parse_recipe(stored), run, resume=True, progress=False)
    assert (run / "recipe.yaml").read_text() == before
    assert torch.load(run / "last.pt", weights_only=True)["step"] == 2


def test_a_change_of_channels_under_auto_strides_is_a_difference(tmp_path):
    recipe = small_volume_recipe(str(tmp_path / "cache"))
    recipe["model"].update(strides="auto", channels=[4, 8])
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    train(parse_recipe(recipe), tmp_path / "run", progress=False)
    planned = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())["model"]
    assert planned["channels"] == [4, 8] and planned["strides"] != "auto"
    assert resume_recipe(tmp_path / "run", path).model.options["channels"] == [4, 8]  # the same recipe resumes
    with pytest.raises(
        ConfigError, match=r"cannot change model.channels \(model.channels: \[4, 8\] there, \[4, 16\] here\)"
    ):
        resume_recipe(tmp_path / "run", path, overrides=["model.channels=[4,16]"])


@pytest.mark.parametrize(
    "ours, theirs",
    [
        ({"scale": 1}, {"scale": 1.0}),
        ({"flag": True}, {"flag": 1}),
        ({"size": (1, 2)}, {"size": [1, 2]}),
        ({"a": None}, {}),
        ({"nested": {"k": 1}}, {"nested": {"k": 1.0}}),
        ({"x": 2}, {"x": 2}),
    ],
)
def test_the_comparison_and_the_digest_follow_one_rule(ours, theirs):
    a = {"model": {"architecture": "unet", "upsampler_options": ours}, "train": ours}
    b = {"model": {"architecture": "unet", "upsampler_options": theirs}, "train": theirs}
    same_digest = recipe_digest(a) == recipe_digest(b)
    assert (first_difference(a, b) is None) == same_digest
    assert (not differences(a, b)) == same_digest


def _rows(run):
    import csv

    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))
