"""The variants of a comparison: ``NAME`` or ``NAME:KEY=VALUE,...`` strings parsed into upsampler
names with options and labels."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from upzoo.errors import ConfigError

__all__ = ["Variant", "parse_variants"]


@dataclass(frozen=True)
class Variant:
    """An upsampler with options: ``interp_conv:mode=bilinear`` -> ``Variant("interp_conv", {...})``."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name + "".join(f" {k}={_flow(v)}" for k, v in self.options.items())


def _flow(value: Any) -> str:
    """A value as the command line wrote it: mappings and lists in YAML flow style, not Python's repr."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return str(value)


def _split_outside_brackets(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` where no ``{}``/``[]`` bracket is open, so that a YAML value
    such as ``{mode: nearest, kernel_size: 5}`` stays whole."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "{[") - (char in "}]")
        if char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def parse_variants(text: str) -> list[Variant]:
    """``"transposed,interp_conv:mode=bilinear,sapa:variant=inner"`` -> variants (values as YAML;
    a mapping or list value keeps its commas and colons: ``last_upsampler_options={kernel_size: 5}``).

    Raises:
        ConfigError: empty names, a malformed option, a variant given twice.
    """
    from upzoo.yaml_files import parse_yaml

    variants = []
    parts = [p.strip() for p in _split_outside_brackets(str(text), ",")]
    for index, part in enumerate(parts):
        if not part:
            if len(parts) == 1:
                break
            raise ConfigError(
                f"--upsamplers {text!r}: variant {index + 1} of {len(parts)} is empty; remove the extra comma"
            )
        name, *pairs = _split_outside_brackets(part, ":")
        options = {}
        for pair in filter(None, pairs):
            key, eq, value = pair.partition("=")
            if not eq or not key.strip():
                raise ConfigError(f"--upsamplers: {part!r} has a malformed option {pair!r}; use NAME:KEY=VALUE")
            options[key.strip()] = parse_yaml(value, f"--upsamplers {part}")
        variants.append(Variant(name.strip(), options))
    if not variants:
        raise ConfigError(f"--upsamplers takes comma-separated block names such as transposed,dysample, got {text!r}")
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--upsamplers names a variant twice: {text!r}")
    return variants
