"""The packages' shape holds: small modules, a short ground floor, no import cycle, every
package importing only what its ``__init__`` docstring declares, all of it below itself, and the
product (``tangram_celery``) never importing its test bench (``tangram_bench``).

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
BENCH = ROOT / "tangram_bench"
TOPS = ("tangram_celery", "tangram_bench")
MAX_LINES = 400
MAX_GROUND_MODULES = 10
GROUND = "the ground floor"
LAYERS = (
    "scheduling", "sandbox", "managers", "reward", "tasks", "pools",
    "observe", "client", "gateway", "integrations", "autoscale", "stack",
)
"""The product's packages from the bottom up: each may import the ground floor and packages
below it."""
BENCH_LAYERS = ("workloads", "sim")
"""The bench's packages from the bottom up: each may import the product and bench packages
below it; the bench's command modules (part ``bench``) may import anything."""
GROUND_PACKAGES = ("action", "settings")
"""Packages that are part of the ground floor (with errors, keys, processes)."""
DECLARATION = re.compile(r"May import:\s*(?P<names>[^.;]*)[.;]", re.S)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for top in (PACKAGE, BENCH) for p in sorted(top.rglob("*.py"))}


def imports_of(path: Path) -> Iterator[str]:
    """Every tangram_celery or tangram_bench module ``path`` imports (a name taken from a package
    resolves to the submodule of that name when there is one, else to the package)."""
    known = modules()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] in TOPS)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in TOPS:
                continue
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield full if full in known else node.module


@cache
def graph() -> dict[str, frozenset[str]]:
    return {name: frozenset(imports_of(path)) - {name} for name, path in modules().items()}


def part_of(module: str) -> str:
    """The part of the architecture a module belongs to: its top package, ``the ground floor``
    for a module directly under tangram_celery, ``cli`` for the command line; in the bench,
    ``workloads``, ``sim`` or else ``bench``."""
    bits = module.split(".")
    if bits[0] == "tangram_bench":
        return bits[1] if len(bits) > 1 and bits[1] in BENCH_LAYERS else "bench"
    if len(bits) == 1:
        return "package"
    if bits[1] in LAYERS:
        return bits[1]
    return "cli" if bits[1] == "cli" else GROUND


def package_dir(package: str) -> Path:
    return (BENCH if package in BENCH_LAYERS else PACKAGE) / package


def declared_imports(package: str) -> frozenset[str]:
    """What ``package``'s ``__init__`` docstring says it may import."""
    init = package_dir(package) / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    found = DECLARATION.search(doc)
    assert found, f"{init.relative_to(ROOT)}: its docstring has no 'May import: ...'"
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
    roots = (PACKAGE, BENCH, ROOT / "workers", ROOT / "triton_models", ROOT / "examples")
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
    for init in sorted([*PACKAGE.rglob("__init__.py"), *BENCH.rglob("__init__.py")]):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 40, f"{init.relative_to(ROOT)} has no docstring saying what it is"


def allowed_below(package: str) -> set[str]:
    """The parts ``package`` may import: the ground floor and the layers below it (for a bench
    package: every product layer and the bench layers below it)."""
    if package in BENCH_LAYERS:
        return {GROUND, *LAYERS, *BENCH_LAYERS[:BENCH_LAYERS.index(package)]}
    return {GROUND, *LAYERS[:LAYERS.index(package)]} if package in LAYERS else {GROUND}


@pytest.mark.parametrize("package", GROUND_PACKAGES + LAYERS + BENCH_LAYERS)
def test_a_package_imports_what_it_declares_and_only_downwards(package: str) -> None:
    declared = declared_imports(package)
    below = allowed_below(package)
    assert declared <= below, f"{package} declares imports from above it: {declared - below}"
    top = "tangram_bench" if package in BENCH_LAYERS else "tangram_celery"
    inside = f"{top}.{package}"
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


def bench_references(path: Path) -> list[str]:
    """What in ``path`` reaches the bench: an import of it, or a string naming one of its
    modules outside a docstring (as ``importlib.import_module`` would take it)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    loaders = {"import_module", "__import__", "find_spec", "run_module"}
    loaded = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in loaders
              for arg in node.args}
    found = [name for name in imports_of(path) if name.split(".")[0] == "tangram_bench"]
    found += [node.value for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings
              and (re.match(r"tangram_bench\.\w", node.value)
                   or (id(node) in loaded and re.match(r"tangram_bench\b", node.value)))]
    return found


def test_the_product_never_imports_the_bench() -> None:
    reaching = {str(p.relative_to(ROOT)): found for p in sorted(PACKAGE.rglob("*.py"))
                if (found := bench_references(p))}
    assert reaching == {}


def test_the_bench_packages_are_in_their_layers() -> None:
    directories = {p.name for p in BENCH.iterdir() if (p / "__init__.py").exists()}
    assert set(BENCH_LAYERS) <= directories
    assert not set(BENCH_LAYERS) & set(LAYERS)


def test_the_checks_can_fail(tmp_path: Path) -> None:
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": []}) == []
    source = tmp_path / "x.py"
    source.write_text("from tangram_celery.pools.cpu_pool import node\nimport tangram_celery.keys\n"
                      "def f() -> None:\n    from tangram_celery.client import TangramClient\n")
    assert sorted(imports_of(source)) == [
        "tangram_celery.client", "tangram_celery.keys", "tangram_celery.pools.cpu_pool.node"]
    assert part_of("tangram_celery.keys") == GROUND
    assert part_of("tangram_celery.pools.cpu_pool.node") == "pools"
    assert part_of("tangram_celery.action.model") == GROUND
    assert part_of("tangram_bench.sim.engine") == "sim"
    assert part_of("tangram_bench.suite") == "bench"
    leak = tmp_path / "leak.py"
    leak.write_text('"""Mentions tangram_bench.sim in a docstring only."""\n'
                    "import importlib\n"
                    "def f() -> object:\n"
                    "    return importlib.import_module('tangram_bench'), 'tangram_bench.cli'\n"
                    "DIRS = ('tangram_bench', 'workers')\n")
    assert sorted(bench_references(leak)) == ["tangram_bench", "tangram_bench.cli"]
