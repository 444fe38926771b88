"""The one validator: plain data (YAML, JSON, ``--set`` overrides, keyword arguments) checked once,
at the edge, with pydantic — recipe sections as models (:mod:`upzoo.sections`), model and block
options against the constructors' own signatures and type hints — and the one formatter that turns
every problem into ``path: expected X, got V (type)``.

Types are checked strictly: a boolean is not a number, text is not a number, a number is not a
boolean; a list is accepted where a sequence is expected and an int where a float is.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from upzoo.errors import ConfigError, did_you_mean

__all__ = [
    "describe_type",
    "check_value",
    "validate_kwargs",
    "kwargs_json_schema",
    "type_hints",
    "config_error",
    "positional_deprecated",
    "shown",
]

_STRICT = ConfigDict(strict=True, arbitrary_types_allowed=True)


def describe_type(tp: Any) -> str:
    """A readable name for a type hint: ``a whole number or a list of whole numbers``.

    >>> describe_type(int | None)
    'a whole number or null'
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is inspect.Parameter.empty:
        return "anything"
    if tp is type(None) or tp is None:
        return "null"
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        inner = args[0] if args and args[0] is not Ellipsis else Any
        return f"a list of {describe_type(inner).removeprefix('a ')}" if inner is not Any else "a list"
    if origin in (dict, Mapping) or tp is dict:
        return "a mapping"
    return _NAMES.get(tp, getattr(tp, "__name__", str(tp)))


_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "text", Path: "a path"}


def shown(value: Any) -> str:
    """``repr(value)`` cut to 60 characters (a huge value is not echoed back whole)."""
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


@functools.cache
def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(tp, config=_STRICT)


def check_value(value: Any, tp: Any, path: str) -> Any:
    """``value`` validated against type hint ``tp`` by pydantic in strict mode (ints become floats
    where a float is expected, strings Paths where a Path is).

    >>> check_value(3, float, "x")
    3.0

    Raises:
        ConfigError: ``"path: expected X, got V (type)"`` (Literal choices with a did-you-mean).
    """
    if tp is Any or tp is inspect.Parameter.empty:
        return value
    if isinstance(value, str) and "Path" in str(tp):
        value = Path(value)
    try:
        return _adapter(tp).validate_python(value)
    except ValidationError:
        pass
    if typing.get_origin(tp) is Literal:
        choices = typing.get_args(tp)
        hint = did_you_mean(str(value), [str(a) for a in choices])
        raise ConfigError(f"{path}: expected one of {', '.join(repr(a) for a in choices)}, got {value!r}{hint}")
    raise ConfigError(f"{path}: expected {describe_type(tp)}, got {shown(value)} ({type(value).__name__})")


def type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The resolved type hints of a function or of a class's ``__init__`` (``{}`` if unresolvable)."""
    target = fn.__init__ if isinstance(fn, type) else fn
    try:
        return typing.get_type_hints(target)
    except Exception:  # unresolvable hints: check names only
        return {}


def validate_kwargs(fn: Callable[..., Any], data: Any, path: str, *, fixed: Sequence[str] = ()) -> dict[str, Any]:
    """Check a mapping of keyword arguments for ``fn`` (a function or class) against its signature:
    unknown keys (with did-you-mean), missing required ones, and each value's type (:func:`check_value`).
    ``fixed`` names parameters the caller supplies itself.

    Raises:
        ConfigError: naming the key path.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of options, got {shown(data)} ({type(data).__name__})")
    signature = inspect.signature(fn)
    params = {
        name: p
        for name, p in signature.parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in fixed
    }
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    hints = type_hints(fn)
    out: dict[str, Any] = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key in params:
            out[key] = check_value(value, hints.get(key, Any), key_path)
        elif takes_any:
            out[key] = value
        else:
            raise ConfigError(
                f"{key_path}: unknown key; known keys: {', '.join(params)}{did_you_mean(str(key), params)}"
            )
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in out]
    if missing:
        raise ConfigError(f"{path or 'config'}: missing required key(s): {', '.join(missing)}")
    return out


def kwargs_json_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON Schema of the keyword arguments :func:`validate_kwargs` takes for ``fn``: one property
    per parameter (its type where pydantic can state it, its default where JSON holds it), the
    required ones, and no other key unless ``fn`` takes ``**kwargs``."""
    signature, hints = inspect.signature(fn), type_hints(fn)
    properties: dict[str, Any] = {}
    for name, p in signature.parameters.items():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        try:
            prop = TypeAdapter(hints[name]).json_schema() if name in hints else {}
        except Exception:  # a type JSON cannot state (a module, a callable): any value
            prop = {}
        if "$defs" in prop or "$ref" in str(prop):  # its references would resolve against the recipe's root
            prop = {}
        if p.default is not p.empty and isinstance(p.default, (str, int, float, bool, type(None))):
            prop["default"] = p.default
        properties[name] = prop
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    required = [n for n, p in signature.parameters.items() if n in properties and p.default is p.empty]
    return {"properties": properties, "required": required, "additionalProperties": takes_any}


def _path(section: str, loc: tuple[Any, ...]) -> str:
    parts = [section]
    for item in loc:
        parts[-1:] = [f"{parts[-1]}[{item}]"] if isinstance(item, int) else [*parts[-1:], str(item)]
    return ".".join(parts)


_EXPECTED = {
    "float": "a number",
    "int": "a whole number",
    "bool": "true or false",
    "string": "text",
    "tuple": "a list",
    "list": "a list",
    "dict": "a mapping",
}


def config_error(exc: ValidationError, section: str, model: type[BaseModel]) -> ConfigError:
    """The first problem pydantic found in a recipe section, in the same one-line shape as
    :func:`check_value`: the key's path, what is allowed, what came."""
    error = exc.errors()[0]
    loc = tuple(x for x in error["loc"] if not (isinstance(x, str) and ("[" in x or x.startswith("function-"))))
    path = _path(section, loc)
    if error["type"] == "extra_forbidden":
        known = list(model.model_fields)
        return ConfigError(f"{path}: unknown key; known keys: {', '.join(known)}{did_you_mean(str(loc[-1]), known)}")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "value_error" and not loc:  # a check across keys names its own key
        return ConfigError(f"{section}.{message}")
    given = error.get("input")
    kind = error["type"].split("_")[0]
    if error["type"] == "literal_error":
        options = re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", "")))
        hint = did_you_mean(str(given), options) if isinstance(given, str) else ""
        return ConfigError(f"{path}: expected one of {', '.join(map(repr, options))}, got {shown(given)}{hint}")
    if error["type"].endswith(("_type", "_parsing", "_from_float")) and kind in _EXPECTED:
        return ConfigError(f"{path}: expected {_EXPECTED[kind]}, got {shown(given)} ({type(given).__name__})")
    return ConfigError(f"{path}: {message[0].lower() + message[1:]}, got {shown(given)}")


def positional_deprecated(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate an ``__init__`` whose arguments ``names`` became keyword-only: calls that still pass
    them by position work for one more release, with a ``FutureWarning`` naming the keywords (timm's
    way of changing a signature without breaking its users). The signature seen by ``inspect`` and
    by :func:`validate_kwargs` is the new, keyword-only one.

    Raises:
        TypeError: more positional arguments than ``names``, or one given both ways.
    """

    def decorate(init: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(init)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if args:
                owner = type(self).__name__
                if len(args) > len(names):
                    raise TypeError(f"{owner} takes at most {len(names)} positional arguments, got {len(args)}")
                given = names[: len(args)]
                twice = [name for name in given if name in kwargs]
                if twice:
                    raise TypeError(f"{owner} got {twice[0]!r} both by position and by keyword")
                import warnings

                warnings.warn(
                    f"{owner}: pass {', '.join(f'{n}=' for n in given)} by keyword; positional arguments are "
                    f"deprecated and stop working in the next release",
                    FutureWarning,
                    stacklevel=2,
                )
                kwargs.update(zip(given, args))
            return init(self, **kwargs)

        return wrapper

    return decorate
