"""Validating plain data (YAML, JSON, ``--set`` overrides) against type hints, once, at the edge.

Errors name the path of the offending key (``train.lr``), what was expected and what came, and
suggest the closest known key for a typo.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union

from upzoo.errors import ConfigError, did_you_mean

_SEQUENCES = (list, tuple, collections.abc.Sequence)
_MAPPINGS = (dict, collections.abc.Mapping)

__all__ = ["check_type", "type_hints", "validate_kwargs", "from_dict", "describe_type", "parse_yaml", "read_yaml_file"]


def describe_type(tp: Any) -> str:
    """A readable name for a type hint: ``int or list of int``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return "anything"
    if tp is type(None) or tp is None:
        return "null"
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in _SEQUENCES or tp in (list, tuple):
        inner = args[0] if args and args[0] is not Ellipsis else Any
        return f"list of {describe_type(inner)}"
    if origin in _MAPPINGS or tp is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _fail(path: str, tp: Any, value: Any) -> ConfigError:
    shown = repr(value) if len(repr(value)) < 60 else repr(value)[:57] + "..."
    return ConfigError(f"{path}: expected {describe_type(tp)}, got {shown} ({type(value).__name__})")


def check_type(value: Any, tp: Any, path: str) -> Any:
    """Return ``value`` checked against type hint ``tp`` (lists become tuples where a tuple is
    expected, ints become floats where a float is, strings become Paths where a Path is).

    Raises:
        ConfigError: ``"path: expected X, got V (type)"``.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is inspect.Parameter.empty:
        return value
    if tp is type(None) or tp is None:
        if value is None:
            return None
        raise _fail(path, tp, value)
    if origin in (Union, types.UnionType):
        for option in args:
            try:
                return check_type(value, option, path)
            except ConfigError:
                continue
        raise _fail(path, tp, value)
    if origin is Literal:
        if value in args and not isinstance(value, bool):
            return value
        raise ConfigError(
            f"{path}: expected one of {', '.join(repr(a) for a in args)}, got {value!r}"
            f"{did_you_mean(str(value), [str(a) for a in args])}"
        )
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _fail(path, tp, value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _fail(path, tp, value)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _fail(path, tp, value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _fail(path, tp, value)
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise _fail(path, tp, value)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        return from_dict(tp, value, path)
    if origin in _SEQUENCES or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _fail(path, tp, value)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise _fail(path, tp, value)
            return tuple(check_type(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        inner = args[0] if args else Any
        items = [check_type(v, inner, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple or tp is tuple else items
    if origin in _MAPPINGS or tp is dict:
        if not isinstance(value, Mapping):
            raise _fail(path, tp, value)
        inner = args[1] if len(args) == 2 else Any
        return {k: check_type(v, inner, f"{path}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise _fail(path, tp, value)


def type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The resolved type hints of a function or of a class's ``__init__`` (``{}`` if unresolvable)."""
    target = fn.__init__ if isinstance(fn, type) else fn
    try:
        return typing.get_type_hints(target)
    except Exception:  # unresolvable hints: check names only
        return {}


def validate_kwargs(fn: Callable[..., Any], data: Any, path: str, *, fixed: Sequence[str] = ()) -> dict[str, Any]:
    """Check a mapping of keyword arguments for ``fn`` (a function or class): unknown keys, missing
    required ones and types. ``fixed`` names parameters the caller supplies itself.

    Raises:
        ConfigError: naming the key path, with a did-you-mean for unknown keys.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of options, got {data!r} ({type(data).__name__})")
    params = {
        name: p
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in fixed
    }
    takes_any = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    hints = type_hints(fn)
    out: dict[str, Any] = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in params:
            if takes_any:
                out[key] = value
                continue
            raise ConfigError(
                f"{key_path}: unknown key; known keys: {', '.join(params)}{did_you_mean(str(key), params)}"
            )
        out[key] = check_type(value, hints.get(key, Any), key_path)
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in out]
    if missing:
        raise ConfigError(f"{path or 'config'}: missing required key(s): {', '.join(missing)}")
    return out


def from_dict(cls: type, data: Any, path: str) -> Any:
    """Build dataclass ``cls`` from a mapping, validated (see :func:`validate_kwargs`)."""
    return cls(**validate_kwargs(cls, data, path))


def parse_yaml(text: str, what: str) -> Any:
    """YAML text parsed with the safe loader.

    Raises:
        ConfigError: ``"what: invalid YAML at line N: problem"``.
    """
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:  # ReaderError (control characters) has no problem_mark
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or type(exc).__name__
        raise ConfigError(f"{what}: invalid YAML{at}: {problem}") from None


def read_yaml_file(path: str | Path, what: str = "recipe") -> Any:
    """A YAML file read as UTF-8 text and parsed with the safe loader (``{}`` when empty).

    Raises:
        ConfigError: a missing, unreadable, binary or non-UTF-8 file, or invalid YAML; naming it.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    if b"\0" in raw:
        raise ConfigError(f"{what} {str(path)!r} is a binary file, not YAML text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    data = parse_yaml(text, str(path))
    return {} if data is None else data
