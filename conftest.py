"""The examples of README.md and docs/*.md run as tests (sybil), so that every example in the docs
works as written:

- ``python`` blocks are executed (one namespace per document);
- ``bash`` blocks: each ``upzoo`` command line that is quick (predict, export, sample, shapes,
  recipe, list, eval) runs for real; long jobs (``train``, ``bench``) are parsed by click,
  which checks every subcommand, option, choice and file; ``python tools/...`` scripts must exist.
  ``pip``, ``pytest`` and shell helpers are left to CI.

Both run in a workspace holding what the docs name: tiny trained runs at ``runs/quickstart-<time>``,
``runs/volume-<time>``, ``runs/dcgan-<time>``, ``runs/sr_espcn_x2-<time>`` (super-resolution) and
``runs/featup-jafar`` (feature upsampling),
``street.png``, ``photos/``, ``scans/``, ``Task01/dataset.json``, ``model.onnx`` and the recipes (a
fresh copy per document).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
from pathlib import Path

import pytest

if importlib.util.find_spec("submitit") is not None:
    # imported here, before any in-process CLI run: submitit binds its logging handler to the stderr
    # of the moment it is imported, and CliRunner's stream is closed after the command (once OpenVINO
    # has run in the process, a later record to it loses sys.stderr for the rest of the worker)
    import submitit  # noqa: F401
from sybil import Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser

if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    import torch

    torch.set_num_threads(1)  # one thread per pytest-xdist worker: two workers share the two cores

ROOT = Path(__file__).resolve().parent
QUICK = {"predict", "export", "sample", "shapes", "recipe", "list", "eval"}


def _workspace(namespace: dict) -> Path:
    """This document's copy of the session's workspace (built once by the ``docs_workspace`` fixture)."""
    if "_workspace" not in namespace:
        template: Path = namespace["docs_workspace"]
        copy = template.parent / f"doc-{len(list(template.parent.glob('doc-*')))}"
        shutil.copytree(template, copy, symlinks=True)
        namespace["_workspace"] = copy
    return namespace["_workspace"]


class _InWorkspace:
    def __init__(self, namespace: dict) -> None:
        self.path, self.previous = _workspace(namespace), Path.cwd()

    def __enter__(self) -> None:
        os.chdir(self.path)

    def __exit__(self, *exc) -> None:
        os.chdir(self.previous)


_python = PythonEvaluator()


def evaluate_python(example) -> str | None:
    with _InWorkspace(example.namespace):
        return _python(example)


def evaluate_bash(example) -> str | None:
    """The first problem of the block's commands as the failure text (sybil reports it), or None."""
    with _InWorkspace(example.namespace):
        for words in _command_lines(example.parsed):
            problem = _check_command(words)
            if problem:
                return problem
    return None


def _command_lines(source: str) -> list[list[str]]:
    """Shell lines -> commands: continuations joined, comments dropped, split at ``&&``, ``|`` and
    ``;``, redirections (``< file``, ``> file``) left out."""
    commands: list[list[str]] = []
    for line in source.replace("\\\n", " ").splitlines():
        current: list[str] = []
        words = iter([*shlex.split(line, comments=True), "&&"])
        for word in words:
            if word in ("<", ">", ">>"):
                next(words)
            elif word in ("&&", "|", ";"):
                commands += [current] if current else []
                current = []
            else:
                current.append(word)
    return commands


def _check_command(words: list[str]) -> str | None:
    if words[0] == "upzoo":
        return _upzoo(words[1:])
    if words[0] == "python" and len(words) > 1 and words[1].startswith("tools/"):
        return None if (ROOT / words[1]).is_file() else f"the docs run {words[1]}, which does not exist"
    if words[0] in ("pip", "pytest", "parallel", "sed", "bash", "mkdocs", "cd"):
        return None
    return f"a command the docs tests do not know how to check: {shlex.join(words)}"


def _upzoo(args: list[str]) -> str | None:
    import click
    from click.testing import CliRunner

    from upzoo.cli import cli, main

    if args and args[0] in QUICK:  # the console script's main: errors become one line and exit 1
        result = CliRunner().invoke(click.Command("upzoo", callback=lambda: main(args)), [])
        return None if result.exit_code == 0 else f"upzoo {shlex.join(args)} failed:\n{result.output}"
    command, name, parent, rest = cli, "upzoo", None, list(args)
    while True:  # parse only: every subcommand, option, choice and file is checked, nothing runs
        try:
            ctx = command.make_context(name, rest, parent=parent)
        except click.ClickException as exc:
            return f"upzoo {shlex.join(args)}: {exc.format_message()}"
        if not isinstance(command, click.Group):
            return None
        name, command, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        parent = ctx


@pytest.fixture(scope="session")
def docs_workspace(tmp_path_factory) -> Path:
    import importlib.util

    # by its path: a package named "tests" in site-packages would shadow this folder
    spec = importlib.util.spec_from_file_location("upzoo_docs_workspace", ROOT / "tests" / "docs_workspace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_workspace(tmp_path_factory.mktemp("docs") / "template", ROOT)


pytest_collect_file = Sybil(
    parsers=[CodeBlockParser("python", evaluate_python), CodeBlockParser("bash", evaluate_bash)],
    patterns=["README.md", "docs/*.md"],
    fixtures=["docs_workspace"],
).pytest()
