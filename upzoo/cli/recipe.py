"""``upzoo recipe``: the JSON Schema of recipes, and a recipe as it resolves."""

from __future__ import annotations

import click

from upzoo.cli.group import CONTEXT, cli
from upzoo.tables import to_json


@cli.group(context_settings=CONTEXT)
def recipe() -> None:
    """Recipes: their JSON Schema (for editors) and a recipe with every default filled in."""


@recipe.command("schema")
def recipe_schema() -> None:
    """Print the JSON Schema of recipes (point an editor's YAML plugin at it to validate while typing)."""
    from upzoo.recipe import recipe_json_schema

    click.echo(to_json(recipe_json_schema()))


@recipe.command("show")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a recipe value.")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of YAML.")
def recipe_show(path: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Print the recipe at PATH validated and resolved: every default filled in, --set applied."""
    import yaml

    from upzoo.recipe import load_recipe

    resolved = load_recipe(path, overrides).to_dict()
    click.echo(to_json(resolved) if as_json else yaml.safe_dump(resolved, sort_keys=False).rstrip())
