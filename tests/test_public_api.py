"""The public API as a reader meets it: every public callable that raises (a ``raise`` in its own
body, or its class's constructor's) says so in a ``Raises:`` section, naming upzoo error classes."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

PACKAGES = ("upzoo", "upzoo.upsamplers", "upzoo.metrics", "upzoo.models", "upzoo.inference", "upzoo.runs",
            "upzoo.shapes", "upzoo.filters")  # fmt: skip


def _public_callables():
    """``(public name, function, its docstring)`` for every public function, every public method of
    a public class and every public class's constructor (documented in the class docstring)."""
    seen = set()
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if id(value) in seen or not callable(value):
                continue
            seen.add(id(value))
            if inspect.isfunction(value):
                yield f"{package}.{name}", value, inspect.getdoc(value) or ""
            elif inspect.isclass(value):
                init = value.__dict__.get("__init__")
                if inspect.isfunction(init):
                    yield f"{package}.{name}", init, (inspect.getdoc(value) or "") + (init.__doc__ or "")
                for attr, method in value.__dict__.items():
                    if inspect.isfunction(method) and not attr.startswith("_"):
                        yield f"{package}.{name}.{attr}", method, inspect.getdoc(method) or ""


def _raises(function) -> bool:
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return re.search(r"^\s+raise \w", source, re.MULTILINE) is not None


def test_every_public_callable_that_raises_has_a_raises_section():
    callables = list(_public_callables())
    assert len(callables) > 150  # the sweep sees the whole API, not a corner of it
    missing = [name for name, function, doc in callables if _raises(function) and "Raises:" not in doc]
    assert missing == []


@pytest.mark.parametrize("error", ["ShapeError", "ConfigError", "DataError", "RegistryError", "TrainingError"])
def test_raises_sections_name_errors_that_exist(error):
    import builtins

    import upzoo.errors

    named = {m for _, _, doc in _public_callables() for m in re.findall(r"^\s+(\w+Error):", doc, re.MULTILINE)}
    assert error in named and all(hasattr(upzoo.errors, n) or hasattr(builtins, n) for n in named), named
