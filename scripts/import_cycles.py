#!/usr/bin/env python3
"""Find import circles inside the ezra package (issue 16: "the import graph has no circle").

Every `import` / `from ... import` of an ezra module is an edge, relative or absolute;
`from . import x` is an edge to x when x is a module, else to the package. Importing a.b.c
also runs a/b/__init__ first, so that is an edge too, unless the importer is inside a.b
(then a.b is loaded already: a package's __init__ importing its parts, which import each
other, is no circle); so is `from . import x` naming the importer's own package. Two graphs
are checked: the imports that run when a module is loaded (module level), and all of them
(also inside functions, which load later, e.g. `app.py` starting the HTTP listener).
Imports under `if TYPE_CHECKING:` never run and are left out. Exit status 1 if the module-level graph has
a circle. Usage: python3 scripts/import_cycles.py [package dir, default ezra]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_names(root: Path) -> dict[str, Path]:
    """{dotted name: file} for every module and package under root (a package's file is __init__.py)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
           (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.Module, module: str, is_package: bool, top_level_only: bool):
    """The dotted names this module imports (before resolving submodules)."""
    found = []

    def visit(body, nested):
        for node in body:
            if isinstance(node, ast.If) and is_type_checking(node):
                visit(node.orelse, nested)
                continue
            if isinstance(node, ast.Import):
                found.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    package = module if is_package else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{node.module}" if node.module else package
                else:
                    base = node.module
                found.append(base)
                found.extend(f"{base}.{alias.name}" for alias in node.names)  # kept only if a module
            is_scope = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if is_scope and top_level_only:
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list) and children and isinstance(children[0], ast.AST):
                    visit(children, nested or is_scope)

    visit(tree.body, False)
    return found


def graph(root: Path, top_level_only: bool) -> dict[str, set[str]]:
    names = module_names(root)
    edges: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        tree = ast.parse(path.read_text(), str(path))
        for target in imports(tree, name, path.name == "__init__.py", top_level_only):
            if target not in names or (name + ".").startswith(target + "."):
                continue  # not an ezra module (a name imported from one), or a package holding this one
            edges[name].add(target)
            parts = target.split(".")
            for depth in range(2, len(parts)):  # the packages on the way run first...
                package = ".".join(parts[:depth])
                if not (name + ".").startswith(package + "."):  # ...unless they contain this module (loaded)
                    edges[name].add(package)
        edges[name].discard(name)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "ezra").resolve()
    status = 0
    for label, top_level_only in (("module level", True), ("all imports, also inside functions", False)):
        edges = graph(root, top_level_only)
        found = cycles(edges)
        print(f"{label}: {len(edges)} modules, {sum(map(len, edges.values()))} edges, "
              f"{len(found)} circle(s)")
        for component in found:
            print("   ", " <-> ".join(component))
        if found and top_level_only:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
