"""The package's shape holds: small modules, a short ground floor, no import cycle, and every
package importing only what its ``__init__`` docstring declares, all of it below itself.

Imports are read from the source (every ``import`` statement, module-level, lazy or under
``TYPE_CHECKING``), so nothing is executed.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tangram_celery"
MAX_LINES = 400
MAX_GROUND_MODULES = 10
GROUND = "the ground floor"
LAYERS = (
    "scheduling", "workloads", "sim", "sandbox", "managers", "reward", "tasks", "pools",
    "observe", "client", "gateway", "integrations", "autoscale", "stack", "bench",
)
"""The packages from the bottom up: each may import the ground floor and packages below it."""
GROUND_PACKAGES = ("action",)
"""Packages that are part of the ground floor (with settings, errors, keys, processes)."""
DECLARATION = re.compile(r"May import:\s*(?P<names>[^.;]*)[.;]", re.S)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path) -> Iterator[str]:
    """Every tangram_celery module ``path`` imports (a name taken from a package resolves to the
    submodule of that name when there is one, else to the package)."""
    known = modules()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "tangram_celery")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "tangram_celery":
                continue
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield full if full in known else node.module


@cache
def graph() -> dict[str, frozenset[str]]:
    return {name: frozenset(imports_of(path)) - {name} for name, path in modules().items()}


def part_of(module: str) -> str:
    """The part of the architecture a module belongs to: its top package, ``the ground floor``
    for a module directly under tangram_celery, ``cli`` for the command line."""
    bits = module.split(".")
    if len(bits) == 1:
        return "package"
    if bits[1] in LAYERS:
        return bits[1]
    return "cli" if bits[1] == "cli" else GROUND


def declared_imports(package: str) -> frozenset[str]:
    """What ``package``'s ``__init__`` docstring says it may import."""
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text())) or ""
    found = DECLARATION.search(doc)
    assert found, f"tangram_celery/{package}/__init__.py: its docstring has no 'May import: ...'"
    names = " ".join(found["names"].replace("`", "").split())
    if names.startswith("nothing"):
        return frozenset()
    return frozenset(n.strip() for n in re.split(r",|\band\b", names) if n.strip())


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return found


def source_files() -> list[Path]:
    roots = (PACKAGE, ROOT / "workers", ROOT / "triton_models", ROOT / "examples")
    return sorted(p for r in roots for p in r.rglob("*.py"))


def test_no_module_is_over_400_lines() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in source_files()}
    assert sizes, "found no source files"
    assert {p: n for p, n in sizes.items() if n > MAX_LINES} == {}


def test_the_ground_floor_is_short() -> None:
    ground = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(ground) <= MAX_GROUND_MODULES, ground
    directories = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert directories == {*LAYERS, *GROUND_PACKAGES}, "every package has its place in LAYERS"


def test_no_import_cycle() -> None:
    assert len(graph()) > 50, "the import graph was read"
    assert cycles(graph()) == []


def test_every_package_says_what_it_is() -> None:
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 40, f"{init.relative_to(ROOT)} has no docstring saying what it is"


@pytest.mark.parametrize("package", GROUND_PACKAGES + LAYERS)
def test_a_package_imports_what_it_declares_and_only_downwards(package: str) -> None:
    declared = declared_imports(package)
    below = {GROUND, *LAYERS[:LAYERS.index(package)]} if package in LAYERS else {GROUND}
    assert declared <= below, f"{package} declares imports from above it: {declared - below}"
    inside = f"tangram_celery.{package}"
    used = {
        (module, part_of(target)) for module in modules()
        if module == inside or module.startswith(inside + ".")
        for target in graph()[module] if not (target == inside or target.startswith(inside + "."))
    }
    undeclared = sorted((m, p) for m, p in used if p not in declared)
    assert undeclared == [], f"{package} imports what its __init__ does not declare"


def test_the_ground_floor_imports_only_itself() -> None:
    upward = sorted((m, t) for m in modules() if part_of(m) == GROUND
                    for t in graph()[m] if part_of(t) != GROUND)
    assert upward == []


def test_the_checks_can_fail(tmp_path: Path) -> None:
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": []}) == []
    source = tmp_path / "x.py"
    source.write_text("from tangram_celery.pools import node\nimport tangram_celery.keys\n"
                      "def f() -> None:\n    from tangram_celery.client import TangramClient\n")
    assert sorted(imports_of(source)) == [
        "tangram_celery.client", "tangram_celery.keys", "tangram_celery.pools.node"]
    assert part_of("tangram_celery.keys") == GROUND
    assert part_of("tangram_celery.pools.node") == "pools"
    assert part_of("tangram_celery.action.model") == GROUND
