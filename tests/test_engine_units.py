"""The engine's parts on their own: loss, optimisers, schedules, the resumable sampler, overrides,
section validation and gradient clipping — each against an independent computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import small_recipe
from upzoo.errors import ConfigError
from upzoo.recipe import apply_overrides, parse_recipe
from upzoo.sections import TrainConfig, validate_section
from upzoo.train.distributed import ResumableSampler
from upzoo.train.optim import build_optimizer, build_scheduler
from upzoo.train.tasks import segmentation_loss


def test_cross_entropy_loss_ignores_the_ignore_label():
    logits, target = torch.randn(2, 4, 5, 6), torch.randint(0, 4, (2, 5, 6))
    target[0, 0] = 255
    got = segmentation_loss(logits, target, kind="ce", ignore_index=255, num_classes=4)
    keep = target != 255
    expected = F.cross_entropy(logits.permute(0, 2, 3, 1)[keep], target[keep])
    torch.testing.assert_close(got, expected)


def test_dice_term_matches_its_definition():
    logits, target = torch.randn(1, 3, 4, 4), torch.randint(0, 3, (1, 4, 4))
    got = segmentation_loss(logits, target, kind="ce+dice", ignore_index=255, num_classes=3)
    p, onehot = logits.softmax(1), F.one_hot(target, 3).permute(0, 3, 1, 2).float()
    dice = [(2 * (p[0, k] * onehot[0, k]).sum() + 1) / (p[0, k].sum() + onehot[0, k].sum() + 1) for k in range(3)]
    expected = F.cross_entropy(logits, target) + 1 - torch.stack(dice).mean()
    torch.testing.assert_close(got, expected)


def test_deep_supervision_weights_halve_per_output():
    target = torch.randint(0, 2, (1, 8, 8))
    main, aux = torch.randn(1, 2, 8, 8), torch.randn(1, 2, 4, 4)
    got = segmentation_loss([main, aux], target, kind="ce", ignore_index=255, num_classes=2)
    small = target[:, ::2, ::2]  # nearest-neighbour downsampling of the labels
    expected = (F.cross_entropy(main, target) + 0.5 * F.cross_entropy(aux, small)) / 1.5
    torch.testing.assert_close(got, expected)


def _train_config(**values) -> TrainConfig:
    return validate_section(TrainConfig, values, "train")


def test_optimizers_get_the_recipe_values():
    params = [torch.nn.Parameter(torch.zeros(3))]
    sgd = build_optimizer(params, _train_config(optimizer="sgd", lr=0.1, momentum=0.8, weight_decay=0.01))
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["nesterov"] and sgd.defaults["momentum"] == 0.8
    adam = build_optimizer(params, _train_config(optimizer="adamw", lr=0.01, betas=[0.5, 0.9], weight_decay=0.0))
    assert isinstance(adam, torch.optim.AdamW) and adam.defaults["betas"] == (0.5, 0.9) and adam.defaults["lr"] == 0.01


@pytest.mark.parametrize(
    "schedule, expected",
    [
        ("poly", lambda p: (1 - p) ** 0.9),
        ("cosine", lambda p: 0.5 * (1 + math.cos(math.pi * p))),
        ("constant", lambda p: 1.0),
    ],
)
def test_schedules_warm_up_linearly_then_follow_their_formula(schedule, expected):
    param = torch.nn.Parameter(torch.zeros(1))
    cfg = _train_config(optimizer="sgd", lr=1.0, momentum=0.0, weight_decay=0.0, schedule=schedule, warmup_steps=4)
    optimizer = build_optimizer([param], cfg)
    scheduler = build_scheduler(optimizer, cfg, total_steps=20)
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert rates[4:] == pytest.approx([expected((s - 4) / 16) for s in range(4, 20)])


def test_sampler_shards_cover_the_data_once_and_resume_mid_epoch():
    data = list(range(10))
    ranks = [ResumableSampler(data, shuffle=True, seed=3, rank=r, world_size=3) for r in range(3)]
    for sampler in ranks:
        sampler.set_epoch(2)
    shards = [list(s) for s in ranks]
    assert all(len(s) == 4 for s in shards) and set(sum(shards, [])) == set(data)  # padded to 12 by wrapping
    again = ResumableSampler(data, shuffle=True, seed=3, rank=1, world_size=3)
    again.set_epoch(2, start=2)
    assert list(again) == shards[1][2:]
    other_epoch = ResumableSampler(data, shuffle=True, seed=3)
    other_epoch.set_epoch(3)
    first_epoch = ResumableSampler(data, shuffle=True, seed=3)
    first_epoch.set_epoch(2)
    assert list(other_epoch) != list(first_epoch)
    evaluation = [list(ResumableSampler(data, shuffle=False, rank=r, world_size=3)) for r in range(3)]
    assert sorted(sum(evaluation, [])) == data  # no sample twice


def test_overrides_reach_nested_keys_and_empty_sections():
    raw = {"model": {"architecture": "unet"}, "data": None}
    out = apply_overrides(raw, ["data.crop_size=[64, 64]", "model.upsampler_options.mode=bilinear", "train.lr=1e-3"])
    assert out["data"] == {"crop_size": [64, 64]} and out["model"]["upsampler_options"] == {"mode": "bilinear"}
    assert raw["data"] is None  # the input is left as it was
    assert out["train"]["lr"] == "1e-3" and _train_config(**out["train"]).lr == 0.001  # YAML 1.1 reads a string
    with pytest.raises(ConfigError, match="'architecture' is not a section"):
        apply_overrides(raw, ["model.architecture.x=1"])
    with pytest.raises(ConfigError, match="--set takes section.key=value"):
        apply_overrides(raw, ["lr=1"])


@pytest.mark.parametrize(
    "values, message",
    [
        ({"epochs": 0}, "train.epochs: input should be greater than or equal to 1, got 0"),
        ({"momentum": 1.0}, "train.momentum: input should be less than 1, got 1.0"),
        ({"betas": [0.9, float("inf")]}, r"train.betas\[1\]: input should be less than 1, got inf"),
        ({"weight_decay": float("nan")}, "train.weight_decay"),
        (
            {"schedule": "cosin"},
            "train.schedule: expected one of 'poly', 'cosine', 'constant', got 'cosin'; did you mean",
        ),
        ({"loggers": ["csv", "wandb"]}, r"train.loggers\[1\]: expected one of 'csv', 'tensorboard', got 'wandb'"),
    ],
)
def test_section_errors_name_the_key_the_value_and_the_range(values, message):
    with pytest.raises(ConfigError, match=message):
        _train_config(**values)


def test_gradient_clipping_limits_the_update(tmp_path):
    """With SGD at lr 1 and no momentum, the update is the clipped gradient: its norm is the limit."""
    from upzoo.prepare import prepare
    from upzoo.train.engine import Trainer
    from upzoo.train.task_factory import make_task

    train = {
        "optimizer": "sgd",
        "lr": 1.0,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "grad_clip": 0.5,
        "schedule": "constant",
    }
    recipe = parse_recipe(small_recipe(tmp_path / "cache", train=train))
    trainer = Trainer(make_task(prepare(recipe)), tmp_path / "run", progress=False)
    trainer.acquire()  # what fit() does first: the folder, the seed, the modules placed, the optimisers
    model = trainer.task.modules["model"]
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    loss = sum(p.sum() for p in model.parameters()) * 1000  # a gradient far above the limit
    trainer.optimize(loss, "model")
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert float((before - after).norm()) == pytest.approx(0.5, rel=1e-4)
    trainer.release()


def test_a_failed_run_releases_its_folder_and_closes_its_loggers(tmp_path):
    """A step that raises: the trainer (still referenced, so nothing is left to its ``__del__``) has
    released the run folder's lock and closed TensorBoard's writer before the error reaches the caller."""
    from upzoo.prepare import prepare
    from upzoo.runs.folder import RunFolder
    from upzoo.runtime import FolderLock
    from upzoo.train.engine import Trainer
    from upzoo.train.task_factory import make_task

    recipe = parse_recipe(small_recipe(tmp_path / "cache", train={"max_steps": 3, "loggers": ["csv", "tensorboard"]}))
    task = make_task(prepare(recipe))

    def broken(batch, ctx):
        with pytest.raises(ConfigError, match="is in use by another run"):  # while it runs, the folder is its own
            RunFolder(tmp_path / "run", ["step"], lock=True)
        raise RuntimeError("boom")

    task.step = broken
    trainer = Trainer(task, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists() and trainer.ctx is None  # built, it holds nothing: fit() takes it all
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit()
    FolderLock(tmp_path / "run", "still locked").release()  # free again
    assert trainer.loggers and trainer.loggers[0].writer.file_writer is None  # closed: events flushed


def test_a_trainer_that_fails_to_set_up_releases_its_folder(tmp_path):
    from upzoo.prepare import prepare
    from upzoo.runs.folder import RunFolder
    from upzoo.train.engine import Trainer
    from upzoo.train.task_factory import make_task

    recipe = parse_recipe(small_recipe(tmp_path / "cache", data={"batch_size": 64}))  # more than the 4 samples
    task = make_task(prepare(recipe))
    trainer = Trainer(task, tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match="data.batch_size 64 is larger than"):
        trainer.fit()
    RunFolder(tmp_path / "run", ["step"], lock=True).close()


def test_a_run_says_its_own_time_estimate_once_after_its_first_steps():
    """The first step (warm-up) is left out; the estimate comes once, at the step that completes the
    next ten, from this machine's time per step."""
    from upzoo.train.monitor import StartEstimate

    clock = iter([0.0, 5.0])  # the first step ends at 0 s, the eleventh at 5 s: 0.5 s per step
    estimate = StartEstimate(start_step=100, total_steps=1300, clock=lambda: next(clock))
    said = [estimate.tick(step) for step in range(101, 140)]
    assert said[:10] == [None] * 10 and all(s is None for s in said[11:])
    assert said[10] == "500 ms per step here: about 10 min for the 1,189 steps left (evaluations not counted)"
