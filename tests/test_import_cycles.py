"""No import cycle inside ``lmgym/``: a walk over every module's imports, read statically.

What counts as an import of ``A`` by ``B``: any ``import``/``from ... import`` in
``B``'s source that names ``A``, absolute (``lmgym.x``) or relative (``.x``),
wherever it stands: at module level, under ``if TYPE_CHECKING:``, or inside a
function. An import moved into a function still makes the two modules depend on
each other; it only hides the cycle from the interpreter until that function
runs, so it counts. ``from pkg import name`` depends on ``pkg.name`` when that is
a module, else on ``pkg`` (its ``__init__``). The parent packages an import runs
implicitly are not edges: a package re-exporting its members would otherwise
form a cycle with each of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lmgym

PACKAGE_DIR = Path(lmgym.__file__).parent

KNOWN_CYCLES: list[frozenset[str]] = []
"""Cycles tolerated for now; the test fails on any other, and on an entry that no longer
occurs (so the list only shrinks)."""

Edges = dict[str, dict[str, int]]
"""module -> {imported module: line of the first such import}."""


def module_files(package_dir: Path) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is a package __init__)}`` for every ``.py`` file under it."""
    root = package_dir.parent
    modules = {}
    for file in sorted(package_dir.rglob("*.py")):
        parts = list(file.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (file, is_package)
    return modules


def imported_names(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Dotted names an import statement in ``module`` may refer to (candidates, unresolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph(package_dir: Path) -> Edges:
    """Every module's imports of modules of the same package (see the module docstring)."""
    modules = module_files(package_dir)
    graph: Edges = {}
    for module, (file, is_package) in modules.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(file.read_text(), filename=str(file))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = imported_names(module, is_package, node)
            if isinstance(node, ast.ImportFrom):
                # ``from pkg import a, b``: the submodules a, b where they are modules, else pkg.
                subs = [n for n in names[:-1] if n in modules]
                names = subs if len(subs) == len(names) - 1 else [*subs, names[-1]]
            for name in names:
                while name not in modules and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name in modules and name != module:
                    edges.setdefault(name, node.lineno)
        graph[module] = edges
    return graph


def cycles(graph: Edges) -> list[list[str]]:
    """Each strongly connected component of more than one module, as one cycle through
    its modules (``[a, b, ..., a]``), sorted by their first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted((cycle_through(graph, c) for c in components), key=lambda c: c[0])


def cycle_through(graph: Edges, component: set[str]) -> list[str]:
    """A shortest cycle from the component's first module back to it, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for other in sorted(graph[node]):
                if other == start:
                    return [*paths[node], start]
                if other in component and other not in paths:
                    paths[other] = [*paths[node], other]
                    following.append(other)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def describe(graph: Edges, cycle: list[str]) -> str:
    """``a -> b (a.py:12) -> a (b.py:3)``."""
    steps = [cycle[0]]
    for here, there in zip(cycle, cycle[1:], strict=False):
        steps.append(f"{there} ({here.rsplit('.', 1)[-1]}.py:{graph[here][there]})")
    return " -> ".join(steps)


def test_no_import_cycle_inside_lmgym():
    graph = import_graph(PACKAGE_DIR)
    found = cycles(graph)
    new = [c for c in found if frozenset(c) not in KNOWN_CYCLES]
    assert not new, "import cycles inside lmgym/ (break each, e.g. move the shared piece " + (
        "into a module both can import):\n" + "\n".join(describe(graph, c) for c in new)
    )
    gone = [sorted(k) for k in KNOWN_CYCLES if k not in {frozenset(c) for c in found}]
    assert not gone, f"these cycles are gone: remove them from KNOWN_CYCLES: {gone}"


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


@pytest.mark.parametrize(
    "a_imports",
    [
        "from pkg.b import thing\n",
        "from . import b\n",
        "from .sub import c\n",
        "def f():\n    from .b import thing\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b\n",
    ],
)
def test_the_walk_finds_a_cycle_however_the_import_is_written(tmp_path, a_imports):
    package = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": a_imports,
            "b.py": "from pkg.sub.c import x\n",
            "sub/__init__.py": "",
            "sub/c.py": "from ..a import y\n",
        },
    )
    graph = import_graph(package)
    (cycle,) = cycles(graph)
    assert cycle[0] == cycle[-1] == "pkg.a"
    assert set(cycle) in ({"pkg.a", "pkg.b", "pkg.sub.c"}, {"pkg.a", "pkg.sub.c"})
    assert describe(graph, cycle).startswith("pkg.a -> ")


def test_a_package_reexporting_its_members_is_no_cycle(tmp_path):
    package = write_package(
        tmp_path,
        {"__init__.py": "from pkg.a import x\n", "a.py": "from pkg.b import y\n", "b.py": ""},
    )
    assert cycles(import_graph(package)) == []
