"""MkDocs hooks (``mkdocs.yml``: ``hooks``) that write the pages generated from the code when the
site is built, so that they cannot drift from it:

- ``index.md``: the README, its ``docs/...`` links made relative to the site;
- ``<!-- upzoo-cli -->``: every ``upzoo`` command, from the click definitions (as ``--help``);
- ``<!-- upzoo-recipe-schema -->``: every recipe section and key with its type and default, from
  the recipe's JSON Schema;
- every page: the docstrings' Sphinx roles (``:func:`x```) shown as the code they name;
- after the build: every public name (the ``__all__`` of ``upzoo`` and of its documented
  packages) has an entry on the API pages, or the build fails naming the ones without.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[1]


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri == "index.md":
        return readme_page()
    markdown = markdown.replace("<!-- upzoo-cli -->", cli_page())
    if "<!-- upzoo-api-table -->" in markdown:
        markdown = markdown.replace("<!-- upzoo-api-table -->", api_table_page())
    return markdown.replace("<!-- upzoo-recipe-schema -->", schema_page())


#: A Sphinx cross-reference role as the docstrings write it and Markdown renders it:
#: ``:func:`x``` -> ``:func:<code>x</code>``; the site shows the code alone.
SPHINX_ROLE = re.compile(r":(?:func|meth|class|data|mod|attr|exc|obj):(<code>)")


#: The packages whose ``__all__`` the API pages document.
API_PACKAGES = ("upzoo", "upzoo.upsamplers", "upzoo.metrics", "upzoo.models", "upzoo.inference", "upzoo.runs",
                "upzoo.shapes", "upzoo.filters", "upzoo.errors")  # fmt: skip
API_IDS: set[str] = set()  # the heading ids of the API pages built so far


def on_page_content(html: str, page: Any = None, **_: Any) -> str:
    """The API pages without the raw Sphinx roles of the docstrings (``:func:`hausdorff95``` reads
    as the code ``hausdorff95``); their entries' ids are kept for :func:`on_post_build`."""
    if page is not None and page.file.src_uri.startswith("reference/api/"):
        API_IDS.update(re.findall(r'id="(upzoo[\w.]*)"', html))
    return SPHINX_ROLE.sub(r"\1", html)


def missing_api_entries(ids: set[str]) -> list[str]:
    """The public names without an entry among the API pages' heading ``ids`` (an entry is its
    path through the package that exports it, or through the module that defines it)."""
    import importlib

    modules = {package: importlib.import_module(package) for package in API_PACKAGES}
    missing = []
    for package, module in modules.items():
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            paths = {f"{getattr(value, '__module__', package)}.{getattr(value, '__qualname__', name)}"}
            paths |= {f"{other}.{name}" for other, m in modules.items() if getattr(m, name, None) is value}
            if not paths & ids:
                missing.append(f"{package}.{name}")
    return missing


def on_post_build(**_: Any) -> None:
    """Fail the build when a public name has no entry on the API pages."""
    from mkdocs.exceptions import PluginError

    missing = missing_api_entries(API_IDS)
    if missing:
        raise PluginError(f"{len(missing)} public name(s) without an API entry: {', '.join(missing)}")


def api_table_page() -> str:
    """One table per group: each public builder or metric, its arguments with their defaults, and
    its return annotation, from :func:`inspect.signature`."""
    import importlib
    import inspect

    groups = {"Model builders": "upzoo.models", "Metrics": "upzoo.metrics"}
    sections = []
    for title, package in groups.items():
        module = importlib.import_module(package)
        rows = ["| name | arguments (default) | returns |", "|---|---|---|"]
        for name in module.__all__:
            value = getattr(module, name)
            if not callable(value) or name[0] == "_" or (inspect.isclass(value) and issubclass(value, Exception)):
                continue
            try:
                signature = inspect.signature(value)
            except (TypeError, ValueError):
                continue
            arguments = ", ".join(_argument(p) for p in signature.parameters.values() if p.name != "self")
            returns = name if inspect.isclass(value) else _annotation(signature.return_annotation)
            rows.append(f"| `{name}` | {_cell(arguments)} | {_cell(returns)} |")
        sections.append(f"## {title}\n\n" + "\n".join(rows))
    return "\n\n".join(sections) + "\n"


def _argument(parameter: Any) -> str:
    import inspect

    prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
    text = f"`{prefix}{parameter.name}`"
    return text if parameter.default is inspect.Parameter.empty else f"{text} ({parameter.default!r})"


def _annotation(annotation: Any) -> str:
    import inspect

    if annotation is inspect.Signature.empty:
        return ""
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def readme_page() -> str:
    """The README with links into ``docs/`` made relative to the site."""
    text = (ROOT / "README.md").read_text()
    return re.sub(r"\]\(docs/", "](", text)


# -- the command line ---------------------------------------------------------------------------------
def cli_page() -> str:
    from upzoo.cli import cli

    return "\n".join(_command_sections(cli, "upzoo", click.Context(cli, info_name="upzoo")))


def _command_sections(command: click.Command, name: str, ctx: click.Context) -> list[str]:
    lines = [f"## `{name}`", "", "```text", command.get_usage(ctx), "```", ""]
    if command.help:
        lines += [_plain(inspect_cleandoc(command.help)), ""]
    rows = [_option_row(p, ctx) for p in command.get_params(ctx) if isinstance(p, click.Option) and not p.hidden]
    if rows:
        lines += ["| option | value | default | what it does |", "|---|---|---|---|", *rows, ""]
    if isinstance(command, click.Group):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                sub_ctx = click.Context(sub, info_name=sub_name, parent=ctx)
                lines += _command_sections(sub, f"{name} {sub_name}", sub_ctx)
    return lines


def inspect_cleandoc(text: str) -> str:
    import inspect

    return inspect.cleandoc(text).replace("\b\n", "")


def _option_row(option: click.Option, ctx: click.Context) -> str:
    names = ", ".join(f"`{o}`" for o in option.opts + option.secondary_opts)
    if option.is_flag:
        value = "flag"
    elif isinstance(option.type, click.Choice):
        value = " \\| ".join(f"`{c}`" for c in option.type.choices)
    else:
        value = option.metavar or option.type.name.upper()
    default = option.get_default(ctx, call=False)
    shown = "" if default in (None, False, ()) or option.is_flag else f"`{default}`"
    return f"| {names} | {value} | {shown} | {_cell(option.help or '')} |"


# -- the recipe schema --------------------------------------------------------------------------------
def schema_page() -> str:
    from upzoo.recipe import recipe_json_schema

    schema = recipe_json_schema()
    lines: list[str] = []
    for section, ref in schema["properties"].items():
        body = schema["$defs"][ref["$ref"].rsplit("/", 1)[1]] if "$ref" in ref else ref
        lines += [f"## `{section}`", "", _plain(body.get("description", "")), ""]
        lines += _key_table(body.get("properties", {}))
        for case in body.get("allOf", []):  # model: the keys of each architecture
            name = case["if"]["properties"]["architecture"]["const"]
            keys = {k: v for k, v in case["then"]["properties"].items() if k != "architecture"}
            lines += [f"### `architecture: {name}`", "", *_key_table(keys)]
    return "\n".join(lines)


def _key_table(properties: dict[str, Any]) -> list[str]:
    lines = ["| key | type | default |", "|---|---|---|"]
    for key, prop in properties.items():
        default = f"`{json.dumps(prop['default'])}`" if "default" in prop else "required"
        lines.append(f"| `{key}` | {_cell(_type(prop))} | {default} |")
    return [*lines, ""]


def _type(prop: dict[str, Any]) -> str:
    if "anyOf" in prop:
        return " or ".join(_type(p) for p in prop["anyOf"])
    if "enum" in prop:
        return " | ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    kind = prop.get("type", "any")
    if kind == "array":
        if "prefixItems" in prop:
            return "[" + ", ".join(_type(p) for p in prop["prefixItems"]) + "]"
        items = _type(prop.get("items", {}))
        count = (prop.get("minItems"), prop.get("maxItems"))
        sizes = f" ({count[0]}-{count[1]} items)" if count[0] is not None and count[0] != count[1] else ""
        return f"list of {items}{sizes}"
    signs = (("exclusiveMinimum", ">"), ("minimum", "≥"), ("exclusiveMaximum", "<"), ("maximum", "≤"))
    bounds = [f"{sign} {prop[key]}" for key, sign in signs if key in prop]
    if "minLength" in prop:
        bounds.append("not empty")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _plain(text: str) -> str:
    """reST-style double backticks and ``:func:`` roles as Markdown code."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return _plain(text).replace("|", "\\|").replace("\n", " ")
