"""The project's import structure, read from the source (nothing is imported).

* No import circles among the project's own modules. Every import counts: at
  module level, inside functions and under ``TYPE_CHECKING`` alike, since each
  one ties the two modules together for a reader and a refactoring.
* No private names across modules: ``from x import _name`` is allowed only when
  ``x._name`` is a module (``from lbm_jax.io import _files``), never for a private
  function, class or constant. A name used by another module is public in its
  home module (ruff's ``SLF`` rule catches ``x._name`` attribute access).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mpjax", "lbm_jax", "experiments")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name."""
    return {
        _module_name(p): p
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
    }


MODULES = _sources()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    is_pkg = MODULES.get(module, Path()).name == "__init__.py"
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """``(module, name or None, line)`` for every import statement of a module."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            found += [(source, a.name, node.lineno) for a in node.names]
    return found


def _edges(module: str) -> set[str]:
    """The project modules ``module`` imports (a submodule named by ``from``
    counts as the submodule, not its package)."""
    out = set()
    for source, name, _ in _imports(module):
        target = f"{source}.{name}" if f"{source}.{name}" in MODULES else source
        if target in MODULES and target != module:
            out.add(target)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def test_the_project_has_modules_to_check():
    assert {
        "lbm_jax.sim._simulation",
        "mpjax._policy",
        "experiments._framework",
    } <= set(MODULES)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    graph = {m: _edges(m) for m in MODULES}
    cycles = _cycles(graph)
    assert not cycles, "modules that import each other (directly or round about): " + (
        "; ".join(" <-> ".join(c) for c in cycles)
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_names_imported_across_modules(package):
    bad = []
    for module, path in MODULES.items():
        if module.split(".")[0] != package:
            continue
        for source, name, line in _imports(module):
            if (
                name is not None
                and name.startswith("_")
                and not name.startswith("__")
                and f"{source}.{name}" not in MODULES
                and source.split(".")[0] in PACKAGES
            ):
                where = f"{path.relative_to(ROOT)}:{line}"
                bad.append(f"{where}: from {source} import {name}")
    assert not bad, "private names imported from another module (make them public "
    "in their home module, or move them):\n" + "\n".join(bad)


@pytest.mark.parametrize("package", PACKAGES)
def test_modules_import_names_from_their_home_not_their_package(package):
    """``from lbm_jax import Simulation`` inside ``lbm_jax`` ties a module to the
    package's ``__init__``, which imports that module in turn; the home module
    (``lbm_jax.sim._simulation``) is named instead. The command-line entry point
    (``__main__``), which the package never imports, is exempt."""
    bad = []
    for module, path in MODULES.items():
        top = module.split(".")[0]
        if top != package or module == package or module.endswith("__main__"):
            continue
        for source, name, line in _imports(module):
            if source == top and name is not None and f"{top}.{name}" not in MODULES:
                where = f"{path.relative_to(ROOT)}:{line}"
                bad.append(f"{where}: from {source} import {name}")
    assert not bad, "names imported from the package instead of their module:\n" + (
        "\n".join(bad)
    )
