"""The command line: outputs, --json, one-line errors with exit code 1, --help everywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from conftest import cli_streams as run
from upzoo.cli import cli

RECIPE = """
model:
  architecture: unet
  spatial_dims: 2
  in_channels: 3
  num_classes: 19
  encoder: resnet18
  upsampler: dysample
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE)
    return str(path)


def _all_commands(group: click.Group, prefix=()):
    for name, command in group.commands.items():
        yield prefix + (name,)
        if isinstance(command, click.Group):
            yield from _all_commands(command, prefix + (name,))


@pytest.mark.parametrize("command", [()] + list(_all_commands(cli)), ids=lambda c: " ".join(c) or "upzoo")
def test_every_command_has_help(command):
    code, out, _ = run(*command, "-h")
    assert code == 0 and "Usage: upzoo" in out and "--help" in out


def test_list_table_and_json():
    code, out, err = run("list")
    assert code == 0 and "| pixel_shuffle | upsampler | 2D/3D |" in out and "| carafe | upsampler | 2D/3D |" in out
    from upzoo.filters.masked_blur import FUSED_CPU_KERNEL

    assert ("masked_blur on the CPU: fused C kernel" in err) == FUSED_CPU_KERNEL
    rows = json.loads(run("list", "*blur*", "--json")[1])
    assert [r["name"] for r in rows] == ["masked_blur"] and rows[0]["params"] == 0


def test_unknown_pattern_is_a_one_line_error():
    code, out, err = run("list", "nothing*")
    assert code == 1 and out == "" and err.count("\n") == 1 and err.startswith("error: no block matches")


def test_shapes_block_and_solve():
    code, out, _ = run("shapes", "block", "transposed", "--scale", "1,2,2", "--input", "1x32x16x33x47")
    assert code == 0 and out.strip() == "transposed: 1x32x16x33x47 -> 1x32x16x66x94 (scale 1x2x2)"
    data = json.loads(
        run(
            "shapes", "block", "pixel_shuffle", "--scale", "2,3", "--input", "2x4x5x7", "--out-channels", "8", "--json"
        )[1]
    )
    assert data["output"] == [2, 8, 10, 21]
    solutions = json.loads(run("shapes", "solve", "--in", "33", "--out", "66", "--stride", "2", "--json")[1])
    assert solutions[0] == {"kernel_size": 2, "padding": 0, "output_padding": 0, "dilation": 1, "uneven_overlap": False}
    code, out, _ = run("shapes", "solve", "--in", "33", "--scale", "2", "--stride", "2")
    assert "| 3 | 1 | 1 | 1 | yes (uneven overlap) |" in out


def test_shapes_model_and_check(recipe):
    code, out, _ = run("shapes", "model", recipe, "--input", "1x3x512x1024")
    assert code == 0 and "| head | Conv2d | 1x19x512x1024 | 323 |" in out
    assert "DySampleUpsampler" in out
    result = json.loads(run("shapes", "check", recipe, "--size", "350x525", "--json")[1])
    assert result["path"] == "analytic" and result["rules"] == ["multiples of 32", "multiples of 32"]
    assert result["axes"][0] == {"axis": 0, "size": 350, "valid": False, "below": 320, "above": 352, "padding": 2}
    result = json.loads(run("shapes", "check", recipe, "--range", "256:2048", "--json")[1])
    assert result["valid_sizes"][:3] == [256, 288, 320] and len(result["valid_sizes"]) == 57


@pytest.mark.parametrize(
    "args, message, exit_code",
    [  # 2: an option value that does not parse (usage); 1: a problem with what it asks for
        (("shapes", "block", "transposed", "--input", "1x3xAx4"), "--input must look like 1x3x512x1024", 2),
        (("shapes", "block", "transposd", "--input", "1x3x4x4"), "did you mean 'transposed'", 1),
        (("shapes", "block", "transposed", "--input", "1x3x4x4", "--scale", "1.5"), "--scale must be an int", 2),
        (("shapes", "solve", "--in", "33", "--stride", "2"), "give exactly one of out_size and scale", 1),
        (("shapes", "solve", "--in", "4", "--out", "1000", "--stride", "2"), "no transposed conv with stride 2", 1),
    ],
)
def test_bad_input_gives_one_line_errors(args, message, exit_code):
    code, out, err = run(*args)
    assert code == exit_code and message in err and err.count("\n") == 1, err


def test_shapes_errors_for_recipes(recipe, tmp_path):
    code, _, err = run("shapes", "model", recipe, "--input", "1x4x64x64")
    assert code == 1 and "expects 3 input channels" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  architecture: unet\n  spatial_dims: 2\n  in_channels: 3\n  num_clases: 2\n")
    code, _, err = run("shapes", "check", str(bad), "--size", "64x64")
    assert code == 1 and "model.num_clases: unknown key" in err and "did you mean 'num_classes'" in err
    code, _, err = run("shapes", "check", str(tmp_path / "missing.yaml"), "--size", "64x64")
    assert code == 2 and "does not exist" in err  # click's own usage error


def test_the_console_script_runs_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "upzoo", "shapes", "block", "nope", "--input", "1x1x4x4"], capture_output=True, text=True
    )
    assert result.returncode == 1 and result.stderr.startswith("error: unknown upsampler 'nope'")
    assert "Traceback" not in result.stderr


def _docs_hooks():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("docs_hooks", Path(__file__).parents[1] / "tools" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_the_api_site_check_names_every_public_name_without_an_entry():
    """The docs build fails (``on_post_build``) when a public name has no entry on the API pages;
    an entry is the name through any package that exports it, or through its defining module."""
    import upzoo.metrics

    hooks = _docs_hooks()
    every = {f"{p}.{n}" for p in hooks.API_PACKAGES for n in getattr(__import__(p, fromlist=["x"]), "__all__", ())}
    assert hooks.missing_api_entries(every) == []
    assert hooks.missing_api_entries(every - {"upzoo.metrics.ring_frequencies"}) == ["upzoo.metrics.ring_frequencies"]
    through_module = every - {"upzoo.metrics.swd"} | {"upzoo.metrics.sliced_wasserstein.swd"}
    assert hooks.missing_api_entries(through_module) == [] and upzoo.metrics.swd.__module__.endswith("wasserstein")
    unet_elsewhere = every - {"upzoo.UNet"}  # documented as upzoo.models.UNet
    assert hooks.missing_api_entries(unet_elsewhere) == []
    assert "upzoo.UNet" in hooks.missing_api_entries(unet_elsewhere - {"upzoo.models.UNet"})


def test_the_api_table_lists_every_builder_and_metric_with_defaults_and_returns():
    import upzoo.metrics
    import upzoo.models

    table = _docs_hooks().api_table_page()
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| `")}
    for package in (upzoo.models, upzoo.metrics):
        for name in package.__all__:
            if callable(getattr(package, name)) and not name.endswith("Error"):
                assert f"`{name}`" in rows, name
    assert "`ignore_index` (255) | ClassScores |" in rows["`mean_iou`"]
    assert "`upsampler` ('transposed')" in rows["`UNet`"] and "| UNet |" in rows["`UNet`"]


def test_the_api_pages_show_sphinx_roles_as_the_code_they_name():
    """mkdocstrings renders ``:func:`x``` as ``:func:<code>x</code>``; the site's hook drops the role."""
    hooks = _docs_hooks()
    html = "see :func:<code>hausdorff95</code>, :meth:<code>Predictor.predict</code> and a time 10:30:<code>x</code>"
    assert hooks.on_page_content(html) == (
        "see <code>hausdorff95</code>, <code>Predictor.predict</code> and a time 10:30:<code>x</code>"
    )


@pytest.mark.slow
def test_a_rank_refusing_its_setting_under_nproc_is_one_line_and_no_launcher_traceback(tmp_path):
    """Each rank prints its one-line error; torchrun's ChildFailedError traceback (some 30 lines) does not
    follow: one line names the ranks that stopped, and the exit code is theirs."""
    command = [sys.executable, "-m", "upzoo", "train", "recipes/quickstart.yaml", "--nproc", "2", "--set",
               "train.max_steps=2", "--set", "data.synthetic_train=1", "--out", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1])
    assert result.returncode == 1
    assert result.stderr.count("error: data.batch_size 4 is larger than this rank's share of the 1 training") == 2
    assert "upzoo train: ranks 0, 1 of the group stopped (exit code 1); the message above says why" in result.stderr
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr


@pytest.mark.parametrize("codes", [{0: -15, 1: 1}, {0: 1, 1: -15}, {0: 1, 1: 1}])
def test_the_launcher_reports_the_code_of_the_rank_that_stopped_not_of_the_one_it_ended(monkeypatch, capsys, codes):
    """torchrun ends the other ranks with SIGTERM once one exits: whichever rank comes first, the exit code
    and the line are those of the rank that stopped by itself."""
    import torch.distributed.run as launcher
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from upzoo.cli import torchrun

    def run(_args):
        failures = {rank: ProcessFailure(rank, 100 + rank, code, "<N/A>") for rank, code in codes.items()}
        raise ChildFailedError("upzoo", failures)

    monkeypatch.setattr(launcher, "run", run)
    monkeypatch.setattr(launcher, "parse_args", lambda argv: argv)
    assert torchrun.main([]) == 1
    assert capsys.readouterr().err == (
        "upzoo train: ranks 0, 1 of the group stopped (exit code 1); the message above says why\n"
    )
