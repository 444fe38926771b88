"""Reading YAML safely: PyYAML's safe loader, with what it lets through refused — a key given twice
in one mapping, aliases that expand to huge documents, deep nesting — and recipe files that are not
regular files, too large, binary or not UTF-8."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from upzoo.errors import ConfigError

__all__ = ["parse_yaml", "read_yaml_file", "MAX_YAML_VALUES", "MAX_YAML_DEPTH", "MAX_YAML_BYTES"]


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
