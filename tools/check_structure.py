"""Check the package's shape: no import cycle between modules or between the package's top-level
parts (its layers), no function over 60 lines, no module over 400 lines. Prints what breaks a rule
and exits 1; CI runs it.

    python tools/check_structure.py [--package upzoo] [--max-function 60] [--max-module 400]

Imports are read from the source (``ast``), all of them — at module level and inside functions, since
a deferred import still ties the two modules together. ``from upzoo.x import y`` counts as an import of
``upzoo.x`` (or of ``upzoo.x.y`` when that is a module), and importing ``upzoo.x.y`` as one of the
package ``upzoo.x`` too, since Python runs its ``__init__`` first (the root package aside: it is the
public API, which imports everything). A cycle is a strongly connected component of
more than one module (Tarjan's algorithm), printed with one of its loops.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

EXEMPT_MODULES: set[str] = set()  # modules allowed over the size limit (none)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` (module ``name``) imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    resolved = set()
    for target in found:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        while target.count(".") >= 1:  # importing a.b.c runs a.b's __init__ too (the root package aside)
            if target != name and not name.startswith(target + "."):
                resolved.add(target)
            target = target.rpartition(".")[0]
    return resolved


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), those with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def a_loop(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One import loop through a component, for the message."""
    members = set(component)
    path, seen = [component[0]], {component[0]}
    while True:
        nxt = sorted(graph[path[-1]] & members)
        back = [n for n in nxt if n == path[0]]
        if back and len(path) > 1:
            return [*path, path[0]]
        nxt = [n for n in nxt if n not in seen]
        if not nxt:
            return [*path, "..."]
        path.append(nxt[0])
        seen.add(nxt[0])


def layer_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The graph between the package's top-level parts (``upzoo.train``, ``upzoo.runtime``, ...): the
    layers of the architecture, which must be acyclic too. The root package (the public API) is left out."""

    def layer(name: str) -> str | None:
        parts = name.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 else None

    layers: dict[str, set[str]] = {}
    for name, targets in graph.items():
        source = layer(name)
        if source is None:
            continue
        layers.setdefault(source, set())
        layers[source] |= {t for t in map(layer, targets) if t is not None and t != source}
    for targets in list(layers.values()):
        for target in targets:
            layers.setdefault(target, set())
    return layers


def long_functions(path: Path, limit: int) -> list[tuple[str, int, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > limit:
                out.append((node.name, node.lineno, length))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default=str(Path(__file__).resolve().parent.parent / "upzoo"))
    parser.add_argument("--max-function", type=int, default=60)
    parser.add_argument("--max-module", type=int, default=400)
    args = parser.parse_args(argv)
    root = Path(args.package)
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = {name: imports_of(path, name, set(files)) for name, path in files.items()}
    problems = []
    for component in strongly_connected(graph):
        problems.append(f"import cycle among {len(component)} modules: {' -> '.join(a_loop(component, graph))}")
    layers = layer_graph(graph, root.name)
    for component in strongly_connected(layers):
        problems.append(f"import cycle among {len(component)} layers: {' -> '.join(a_loop(component, layers))}")
    for name, path in files.items():
        lines = len(path.read_text().splitlines())
        if lines > args.max_module and name not in EXEMPT_MODULES:
            problems.append(f"{path}: {lines} lines (limit {args.max_module})")
        for function, line, length in long_functions(path, args.max_function):
            problems.append(f"{path}:{line}: function {function} has {length} lines (limit {args.max_function})")
    for problem in problems:
        print(problem)
    print(f"{len(files)} modules, {sum(len(v) for v in graph.values())} imports: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
