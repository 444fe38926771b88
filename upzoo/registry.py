"""The one registry class: of upsampling blocks and post-filters (here) and of model architectures
(:data:`upzoo.models.factory.ARCHITECTURES`), with one name rule, wildcard listing, did-you-mean
and entry-point plugins for both.

Built-ins register with :func:`register_upsampler`; third-party packages add blocks through the
entry-point group ``upzoo.upsamplers`` (``name = package.module:Factory``; architectures through
``upzoo.architectures``), loaded once, lazily, on the first lookup. Every block is created the
same way::

    create_upsampler("pixel_shuffle", spatial_dims=2, in_channels=64, out_channels=32, scale=2)
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import inspect
import keyword
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from upzoo.errors import ConfigError, RegistryError, did_you_mean
from upzoo.runtime import warnings_at_caller

__all__ = [
    "BlockInfo",
    "Registry",
    "block_info",
    "origin_of",
    "PluginWarning",
    "UPSAMPLERS",
    "register_upsampler",
    "create_upsampler",
    "list_upsamplers",
    "upsampler_info",
    "block_options",
]

Kind = Literal["upsampler", "post_filter"]
CONTRACT_ARGS = ("spatial_dims", "in_channels", "out_channels", "scale")
_NAME = re.compile(r"[a-z][a-z0-9_]*")


class PluginWarning(UserWarning):
    """A plugin package registered under ``upzoo.upsamplers`` could not be loaded."""


@dataclass(frozen=True)
class BlockInfo:
    """What the registry knows about one block: how to build it and how to describe it."""

    name: str
    factory: Callable[..., nn.Module]
    kind: Kind
    spatial_dims: tuple[int, ...]
    description: str
    origin: str

    @property
    def options(self) -> dict[str, Any]:
        """The block's own options (beyond the contract arguments) with their defaults."""
        params = inspect.signature(self.factory).parameters
        return {
            p.name: p.default
            for p in params.values()
            if p.name not in CONTRACT_ARGS and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        }

    @property
    def keeps_channels(self) -> bool:
        """Whether the block's output has its input's channels (``out_channels`` must equal
        ``in_channels``: parameter-free resizes, zero insertion, post-filters)."""
        return self.kind == "post_filter" or bool(getattr(self.factory, "keeps_channels", False))

    @property
    def needs_style(self) -> bool:
        """A style-conditioned block: ``forward(x, style)``, built with ``style_dim``."""
        return bool(getattr(self.factory, "needs_style", False))

    @property
    def needs_guide(self) -> bool:
        """Whether the block is guided: ``forward(x, guide)`` with a ``guide_channels`` option."""
        return bool(getattr(self.factory, "needs_guide", False))

    @property
    def accepts_any_option(self) -> bool:
        params = inspect.signature(self.factory).parameters.values()
        return any(p.kind is p.VAR_KEYWORD for p in params)


def origin_of(factory: Callable[..., Any]) -> str:
    """``module:QualName`` of a factory (of anything, for the message that refuses it)."""
    module = getattr(factory, "__module__", None) or type(factory).__module__
    return f"{module}:{getattr(factory, '__qualname__', repr(factory))}"


def _first_line(factory: Callable[..., Any]) -> str:
    doc = inspect.getdoc(factory) or ""
    return doc.strip().splitlines()[0].rstrip(".") if doc.strip() else ""


def block_info(
    name: str, factory: Callable[..., nn.Module], origin: str, *, kind: Kind | None = None,
    spatial_dims: tuple[int, ...] | None = None, description: str | None = None,
) -> BlockInfo:  # fmt: skip
    """A block's entry: ``kind``, ``spatial_dims`` and ``description`` default to the factory's
    ``kind`` and ``supported_spatial_dims`` attributes and the first line of its docstring."""
    return BlockInfo(
        name=name,
        factory=factory,
        kind=kind or getattr(factory, "kind", "upsampler"),
        spatial_dims=tuple(spatial_dims or getattr(factory, "supported_spatial_dims", (2, 3))),
        description=description or _first_line(factory),
        origin=origin,
    )


class Registry:
    """A name -> factory table with wildcard listing and entry-point plugins, for blocks and for
    architectures alike: ``make_info(name, factory, origin, **fields)`` builds an entry (an object
    with ``name``, ``factory`` and ``origin``) from what :meth:`register` was given, or from the
    factory's attributes for a plugin.

    Args:
        entry_point_group: the ``importlib.metadata`` group plugins register under.
        what: the word used in error messages (``"upsampler"``, ``"architecture"``).
        make_info: builds an entry (default: :func:`block_info`).
    """

    def __init__(self, entry_point_group: str, what: str = "upsampler", make_info: Callable[..., Any] | None = None):
        self._entries: dict[str, Any] = {}
        self._group = entry_point_group
        self._what = what
        self._make_info = make_info or block_info
        self._plugins_loaded = False
        self._shadowed_by_plugins: dict[str, Any] = {}  # what each plugin entry replaced

    # -- registering -------------------------------------------------------------------------------
    def register(
        self, name: str, *, override: bool = False, **fields: Any
    ) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
        """Decorator registering a class or factory function under ``name`` (``fields``: the
        entry's other fields, e.g. a block's ``kind``).

        Raises:
            RegistryError: bad name, or the name is taken and ``override`` is false.
        """

        def decorator(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
            self.add(self.make(name, factory, origin_of(factory), **fields), override=override)
            return factory

        return decorator

    def make(self, name: str, factory: Callable[..., nn.Module], origin: str, **fields: Any) -> Any:
        """An entry for ``name``, checked: lowercase snake case and not a Python keyword, a callable
        factory, and whatever ``make_info`` checks of the fields.

        Raises:
            RegistryError: a bad name or a factory that is not callable, naming where it came from.
        """
        if not isinstance(name, str) or not _NAME.fullmatch(name) or keyword.iskeyword(name):
            raise RegistryError(
                f"{self._what} names are lowercase snake case and not a Python keyword, like 'my_{self._what}', "
                f"got {name!r} from {origin}"
            )
        if not callable(factory):
            raise RegistryError(f"{self._what} {name!r} from {origin} is not callable: got {factory!r}")
        return self._make_info(name, factory, origin, **fields)

    def add(self, info: Any, *, override: bool = False) -> None:
        """Add a prepared entry; see :meth:`register`."""
        existing = self._entries.get(info.name)
        if existing is not None and not override and existing.factory is not info.factory:
            raise RegistryError(
                f"{self._what} {info.name!r} is registered twice: by {existing.origin} and by {info.origin}; "
                f"rename one, or pass override=True to replace the first"
            )
        self._entries[info.name] = info

    def unregister(self, name: str) -> None:
        """Remove ``name`` (for tests and interactive use)."""
        self._entries.pop(name, None)

    # -- plugins -----------------------------------------------------------------------------------
    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        staged: list[Any] = []
        for ep in importlib.metadata.entry_points(group=self._group):
            package = ep.dist.name if ep.dist is not None else ep.module
            try:
                factory = ep.load()
                info = self.make(ep.name, factory, f"plugin package {package!r} ({ep.value})")
            except Exception as exc:  # a broken plugin must not take the built-ins down
                warnings.warn(
                    f"upzoo: skipped the {self._what} plugin {ep.name!r} from package {package!r}: "
                    f"{type(exc).__name__}: {exc}",
                    PluginWarning,
                    stacklevel=3,
                )
                continue
            staged.append(info)
        for info in staged:  # check every conflict before changing anything
            existing = self._entries.get(info.name)
            if existing is not None and not getattr(info.factory, "override", False):
                raise RegistryError(
                    f"{self._what} {info.name!r} is registered twice: by {existing.origin} and by "
                    f"{info.origin}; uninstall one, or set `override = True` on the plugin's factory"
                )
        for info in staged:
            self._shadowed_by_plugins[info.name] = self._entries.get(info.name)
            self._entries[info.name] = info
        self._plugins_loaded = True

    def reload_plugins(self) -> None:
        """Drop the plugin entries (restoring what they overrode) and load the plugins again."""
        for name, previous in self._shadowed_by_plugins.items():
            if previous is None:
                self._entries.pop(name, None)
            else:
                self._entries[name] = previous
        self._shadowed_by_plugins.clear()
        self._plugins_loaded = False
        self._load_plugins()

    # -- looking up --------------------------------------------------------------------------------
    def info(self, name: str) -> Any:
        """The entry for ``name``.

        Raises:
            RegistryError: unknown name, with the registered names and the closest match.
        """
        self._load_plugins()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            names = sorted(self._entries)
            raise RegistryError(
                f"unknown {self._what} {name!r}; registered: {', '.join(names)}{did_you_mean(str(name), names)}"
            ) from None

    def names(self, pattern: str = "*", **where: Any) -> list[str]:
        """Sorted names matching a shell-style ``pattern`` (``"*shuffle*"``), optionally only entries
        whose fields equal ``where`` (``kind="post_filter"``, ``task="gan"``; ``None`` is any)."""
        self._load_plugins()
        wanted = {k: v for k, v in where.items() if v is not None}
        return sorted(
            n
            for n, info in self._entries.items()
            if fnmatch.fnmatchcase(n, pattern) and all(getattr(info, k) == v for k, v in wanted.items())
        )

    def create(self, name: str, /, **kwargs: Any) -> nn.Module:
        """Build block ``name`` with the contract arguments and its own options.

        Raises:
            RegistryError: unknown name, or an option the block does not take (with its options).
            ConfigError: a block that refuses its arguments, or whose weights cannot be allocated.
                Any other exception from a block's constructor is a bug in the block: it propagates
                unchanged, with its traceback.
        """
        info = self.info(name)
        if not info.accepts_any_option:
            known = info.options
            for key in kwargs:
                if key not in known and key not in CONTRACT_ARGS:
                    listed = ", ".join(known) if known else "none"
                    raise RegistryError(
                        f"{self._what} {name!r} has no option {key!r}; its options are: {listed}"
                        f"{did_you_mean(key, known)}"
                    )
        if info.needs_style and "style_dim" not in kwargs:
            raise ConfigError(f"{self._what} {name!r} is style-conditioned: give style_dim= (the width of the style "
                              "vector, the generator's w)")  # fmt: skip
        if info.needs_guide and "guide_channels" not in kwargs:
            raise ConfigError(
                f"{self._what} {name!r} is guided by a high-resolution feature: give guide_channels= (the "
                f"guide's channels: the encoder skip's for fade and sapa, which UNet and smp_unet pass themselves; "
                f"3 for the image-guided jbu, jafar, loftup and anyup, whose guide is the image)"
            )
        kwargs = {**kwargs, **_checked_options(info.factory, name, kwargs)}
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        try:
            inspect.signature(info.factory).bind(**kwargs)
        except TypeError as exc:  # the options do not fit the factory's signature: the caller's mistake
            raise RegistryError(f"{self._what} {name!r} cannot take {shown}: {exc}") from None
        try:
            return info.factory(**kwargs)
        except MemoryError as exc:
            raise ConfigError(f"{self._what} {name!r} cannot be built with {shown}: out of memory") from exc
        except RuntimeError as exc:  # only weights too large to hold are the caller's: a bug is kept whole
            if not any(word in str(exc) for word in ("allocate", "Storage size calculation overflowed")):
                raise
            first = str(exc).splitlines()[0]
            raise ConfigError(f"{self._what} {name!r} cannot be built with {shown}: {first}") from exc


def _checked_options(factory: Callable[..., nn.Module], name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The block's own options checked against its type hints (``bias=[1]`` is not a bool)."""
    from upzoo.validation import check_value, type_hints

    hints = type_hints(factory)
    return {
        k: check_value(v, hints[k], f"{name}.{k}") for k, v in options.items() if k not in CONTRACT_ARGS and k in hints
    }


UPSAMPLERS = Registry("upzoo.upsamplers")


def register_upsampler(
    name: str,
    *,
    kind: Kind | None = None,
    spatial_dims: tuple[int, ...] | None = None,
    description: str | None = None,
    override: bool = False,
) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: register a block class (or factory) in the upsampler registry.

    >>> @register_upsampler("my_block")  # doctest: +SKIP
    ... class MyBlock(Upsampler): ...
    """
    return UPSAMPLERS.register(name, kind=kind, spatial_dims=spatial_dims, description=description, override=override)


def create_upsampler(
    name: str, *, spatial_dims: int, in_channels: int, out_channels: int, scale: int | tuple[int, ...], **options: Any
) -> nn.Module:
    """Build a registered block: ``(B, in_channels, *S) -> (B, out_channels, *S*scale)``.

    >>> up = create_upsampler("transposed", spatial_dims=3, in_channels=8, out_channels=4, scale=(1, 2, 2))
    >>> up.output_shape((1, 8, 5, 16, 16))
    (1, 4, 5, 32, 32)

    Raises:
        RegistryError: unknown name or option. ConfigError: bad contract arguments or option values.
    """
    with warnings_at_caller(f"{name}: "):
        return UPSAMPLERS.create(
            name, spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels, scale=scale, **options
        )


def block_options(options: Any, owner: str) -> dict[str, Any]:
    """A block's options as a model takes them (a mapping of names, or None): the model sets the
    contract arguments (``spatial_dims``, ``in_channels``, ``out_channels``, ``scale``) and the guide's
    channels itself, so options that name them are refused rather than colliding.

    Raises:
        ConfigError: not a mapping, or naming an argument the model sets.
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ConfigError(f"{owner} upsampler_options: expected a mapping of option names to values, got {options!r}")
    taken = [k for k in options if k in (*CONTRACT_ARGS, "guide_channels")]
    if taken:
        raise ConfigError(
            f"{owner} upsampler_options sets {taken[0]}={options[taken[0]]!r}, which the model sets itself at every "
            f"block (its {', '.join(CONTRACT_ARGS)} and a guide's channels); remove it from the options"
        )
    return dict(options)


def list_upsamplers(pattern: str = "*", *, kind: Kind | None = None) -> list[str]:
    """Registered names matching ``pattern`` (shell wildcards), sorted.

    >>> "pixel_shuffle" in list_upsamplers("pixel*")
    True
    """
    return UPSAMPLERS.names(pattern, kind=kind)


def upsampler_info(name: str) -> BlockInfo:
    """Kind, spatial dims, description, options and origin of a registered block."""
    return UPSAMPLERS.info(name)
