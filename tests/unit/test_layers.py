"""The architecture, asserted from the imports: each package of provision/ sits on a floor and
imports only from the floors below it (type-only and function-level imports count too), and no
two modules import each other, however indirectly. docs/architecture.md draws the same floors."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "provision"

# top to bottom; a package imports only from packages on lower floors (and from itself)
FLOORS: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("sync", "setup"),
    ("ui",),
    ("money", "fit"),
    ("jobs", "doctor", "ops", "access"),
    ("facts",),
    ("verify",),
    ("remote", "wheels"),
    ("config", "tables"),
    ("errors", "store", "units"),
)
FLOOR = {name: i for i, floor in enumerate(FLOORS) for name in floor}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The provision modules ``path`` imports, wherever the import statement stands."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "provision":
                continue
            for alias in node.names:  # `from . import x` names a module when x is one
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "provision"}
    return found - {name}


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: imports(path) & set(MODULES) for name, path in MODULES.items()}


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_package_has_a_floor() -> None:
    packages = {top(m) for m in MODULES} - {"", "__main__"}
    assert sorted(packages - set(FLOOR)) == []


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if top(m) in FLOOR))
def test_imports_only_go_down(module: str) -> None:
    mine = FLOOR[top(module)]
    upward = sorted(d for d in GRAPH[module]
                    if top(d) in FLOOR and top(d) != top(module) and FLOOR[top(d)] <= mine)
    assert upward == [], f"{module} imports from its own floor or above: {upward}"


def test_no_import_cycles() -> None:
    # Tarjan's strongly connected components; any component of two or more modules is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The rule itself: a module of a low floor importing a high one is found."""
    bad = tmp_path / "provision" / "remote" / "x.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..setup.plan import Plan\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "provision"
    try:
        assert "provision.setup" in imports(bad) or "provision.setup.plan" in imports(bad)
    finally:
        PACKAGE = saved
