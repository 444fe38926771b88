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


MAX_YAML_VALUES = 100_000  # a recipe holds hundreds; a few aliased lists can expand to billions
MAX_YAML_DEPTH = 50
MAX_YAML_BYTES = 1_000_000


def _unique_key_loader():
    """PyYAML's safe loader, refusing a key given twice in one mapping (YAML forbids it; PyYAML
    silently keeps the last)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise ConfigError(
                        f"duplicate key {key!r} at line {line} (first at line {seen[key]}); a key may appear once "
                        f"per mapping: merge the two"
                    )
                seen.setdefault(key, line) if isinstance(key, (str, int, float, bool)) else None
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _check_size(data: Any, what: str) -> None:
    """Refuse YAML that expands (through aliases) beyond :data:`MAX_YAML_VALUES` values or nests
    deeper than :data:`MAX_YAML_DEPTH`; the walk stops at the limit, so it is cheap."""
    count, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_YAML_VALUES:
            raise ConfigError(
                f"{what}: expands to more than {MAX_YAML_VALUES:,} values (YAML aliases repeating lists?); "
                f"write the values out"
            )
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(f"{what}: nested more than {MAX_YAML_DEPTH} levels deep; a recipe is a few levels deep")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def _check_depth(text: str, what: str) -> None:
    """Walk the YAML events (PyYAML's parser is a state machine, not recursive) and refuse nesting
    deeper than :data:`MAX_YAML_DEPTH`."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(
                    f"{what}: nested more than {MAX_YAML_DEPTH} levels deep; a recipe is a few levels deep"
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def parse_yaml(text: str, what: str) -> Any:
    """YAML text parsed with the safe loader; duplicate keys, alias bombs and deep nesting refused.

    >>> parse_yaml("a: 1\\nb: [2, 3]", "example")
    {'a': 1, 'b': [2, 3]}

    Raises:
        ConfigError: ``"what: invalid YAML at line N: problem"``, or one of the refusals above.
    """
    import yaml

    try:
        _check_depth(text, what)  # before composing: PyYAML's composer recurses per level
        data = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader subclass
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}" if not str(exc).startswith(what) else str(exc)) from None
    except yaml.YAMLError as exc:  # ReaderError (control characters) has no problem_mark
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or type(exc).__name__
        raise ConfigError(f"{what}: invalid YAML{at}: {problem}") from None
    _check_size(data, what)
    return data


def read_yaml_file(path: str | Path, what: str = "recipe") -> Any:
    """A YAML file read as UTF-8 text and parsed with the safe loader (``{}`` when empty).

    Raises:
        ConfigError: a missing, unreadable, binary, oversized or non-UTF-8 file, something that is
            not a regular file (a FIFO would block), or invalid YAML; naming it.
    """
    import stat

    path = Path(path)
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{what} {str(path)!r} is not a regular file; give the path of a YAML file")
        if path.stat().st_size > MAX_YAML_BYTES:
            raise ConfigError(
                f"{what} {str(path)!r} is {path.stat().st_size / 1e6:.1f} MB; a recipe is a small YAML file "
                f"(at most {MAX_YAML_BYTES / 1e6:.0f} MB)"
            )
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
