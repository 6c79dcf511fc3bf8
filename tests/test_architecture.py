"""The arrows of ``../shared/DESIGN.md``, section "Shape", held by reading every import.

Every service imports broker, only its face (its names and ``broker.FACE``, the modules a
service may import); broker imports no service; services never import each other (they
meet only through Redis); ``fairq`` (the command and local stack) is the composition root
and may import them all. No module of the product imports itself back through others
(no circle), counting imports made inside functions too.

``benchmarks`` measures the product from outside: it may import the product, and no package
of the product imports it (``fairq bench`` loads a benchmark by its module's name, which
``test_fairq_bench_names_modules_of_benchmarks`` holds). Inside it each family's
sub-package imports only itself and ``benchmarks.lib``, and ``lib`` imports no family.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("gateway", "batch", "dispatcher", "scaler", "sim", "workers")
PRODUCT = ("broker", *SERVICES, "fairq")
CHECKED = (*PRODUCT, "benchmarks")
BENCH_LIB = "lib"  # the room of benchmarks that every family may import


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules(root: Path, packages: tuple[str, ...] = PRODUCT) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(root, path)] = path
    return found


def imported(tree: ast.AST, here: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """The modules of ``known`` that a module's code imports, at any depth of its code."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _known_prefix(alias.name, known)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, here, is_package)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield from _known_prefix(submodule if submodule in known else base, known)


def _absolute(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parent = here.split(".")
    parent = parent if is_package else parent[:-1]
    parent = parent[: len(parent) - (node.level - 1)]
    return ".".join([*parent, *([node.module] if node.module else [])])


def _known_prefix(name: str, known: set[str]) -> Iterator[str]:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            yield candidate
            return


def import_graph(root: Path, packages: tuple[str, ...] = CHECKED) -> dict[str, set[str]]:
    modules = product_modules(root, packages)
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        graph[name] = set(imported(tree, name, is_package, known)) - {name}
    return graph


def broker_face(root: Path) -> set[str]:
    """The modules of broker a service may import: broker itself and those its ``FACE``
    names (read from its ``__init__.py``, not imported)."""
    tree = ast.parse((root / "broker" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "FACE" for t in node.targets
        ):
            return {"broker", *(f"broker.{name}" for name in ast.literal_eval(node.value))}
    return {"broker"}


def forbidden_arrows(graph: dict[str, set[str]], face: set[str]) -> list[str]:
    """Each import that breaks the rules, as ``importer -> imported``."""
    wrong = []
    for importer, targets in graph.items():
        for target in sorted(targets):
            if not _allowed(importer, target, face):
                wrong.append(f"{importer} -> {target}")
    return wrong


def _allowed(importer: str, target: str, face: set[str]) -> bool:
    source = importer.split(".", maxsplit=1)[0]
    package = target.split(".", maxsplit=1)[0]
    if package == "benchmarks":  # the product never imports its benchmarks
        return source == "benchmarks" and _bench_room(target) in (_bench_room(importer), BENCH_LIB)
    if source in ("fairq", "benchmarks", package):
        return True
    if package != "broker":
        return False  # broker imports no service; services never import each other
    return target in face


def _bench_room(module: str) -> str:
    """The sub-package of benchmarks a module lives in ("suite" for the top-level suite)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle (its modules, sorted), or [] if none."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return sorted(exc.args[1][:-1])
    return []


# -- the product ----------------------------------------------------------------------


def test_every_package_of_the_shape_exists() -> None:
    modules = product_modules(ROOT)
    assert set(PRODUCT) <= set(modules), "a package of DESIGN.md's Shape is missing"


def test_no_import_breaks_the_arrows_of_the_shape() -> None:
    assert forbidden_arrows(import_graph(ROOT), broker_face(ROOT)) == []


def test_no_module_imports_itself_back() -> None:
    assert circle(import_graph(ROOT)) == []


def test_fairq_bench_names_modules_of_benchmarks() -> None:
    from fairq.cli import _Benchmarks

    benchmarks = product_modules(ROOT, ("benchmarks",))
    assert set(_Benchmarks._COMMANDS.values()) <= set(benchmarks)


# -- the checker, on planted imports ---------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def clean(tmp_path: Path) -> Path:
    _tree(
        tmp_path,
        {
            "broker/__init__.py": "FACE = ('keys',)\nfrom broker.keys import ready\n",
            "broker/keys.py": "def ready(): ...\n",
            "broker/inner.py": "",
            "broker/lua/__init__.py": "",
            "gateway/__init__.py": "from broker import keys\n",
            "batch/__init__.py": "import broker.keys\n",
            "dispatcher/__init__.py": "from . import fair\n",
            "dispatcher/fair.py": "from broker.keys import ready\n",
            "workers/__init__.py": "",
            "fairq/__init__.py": "import gateway, batch, dispatcher, workers\n",
            "benchmarks/__init__.py": "",
            "benchmarks/suite.py": "from benchmarks.lib.stats import pct\n",
            "benchmarks/lib/__init__.py": "",
            "benchmarks/lib/stats.py": "import broker.keys\n",
            "benchmarks/fairness/__init__.py": "",
            "benchmarks/fairness/cli.py": "from . import arms\nimport dispatcher\n",
            "benchmarks/fairness/arms.py": "from benchmarks.lib import stats\n",
            "benchmarks/fleet/__init__.py": "",
            "benchmarks/fleet/cli.py": "import fairq\nfrom benchmarks.lib.stats import pct\n",
        },
    )
    return tmp_path


def test_the_checker_passes_a_clean_tree(clean: Path) -> None:
    graph = import_graph(clean)
    assert graph["fairq"] == {"gateway", "batch", "dispatcher", "workers"}
    assert graph["dispatcher"] == {"dispatcher.fair"}
    assert graph["benchmarks.fairness.cli"] == {"benchmarks.fairness.arms", "dispatcher"}
    assert graph["benchmarks.fleet.cli"] == {"fairq", "benchmarks.lib.stats"}
    assert forbidden_arrows(graph, broker_face(clean)) == []
    assert circle(graph) == []


@pytest.mark.parametrize(
    ("path", "line", "arrow"),
    [
        ("broker/keys.py", "from gateway import x", "broker.keys -> gateway"),
        ("gateway/__init__.py", "import dispatcher.fair", "gateway -> dispatcher.fair"),
        ("workers/__init__.py", "def f():\n    from batch import y", "workers -> batch"),
        ("dispatcher/fair.py", "from broker.lua import s", "dispatcher.fair -> broker.lua"),
        ("batch/__init__.py", "import broker.inner", "batch -> broker.inner"),
        ("fairq/__init__.py", "from benchmarks.fleet import cli", "fairq -> benchmarks.fleet.cli"),
        ("gateway/__init__.py", "def f():\n    import benchmarks.lib", "gateway -> benchmarks.lib"),
        (
            "benchmarks/fleet/cli.py",
            "from benchmarks.fairness.arms import y",
            "benchmarks.fleet.cli -> benchmarks.fairness.arms",
        ),
        (
            "benchmarks/lib/stats.py",
            "from benchmarks.fleet import cli",
            "benchmarks.lib.stats -> benchmarks.fleet.cli",
        ),
        (
            "benchmarks/suite.py",
            "import benchmarks.fairness.cli",
            "benchmarks.suite -> benchmarks.fairness.cli",
        ),
    ],
)
def test_the_checker_finds_a_planted_forbidden_import(
    clean: Path, path: str, line: str, arrow: str
) -> None:
    target = clean / path
    target.write_text(target.read_text() + line + "\n")
    assert forbidden_arrows(import_graph(clean), broker_face(clean)) == [arrow]


def test_the_checker_finds_a_planted_circle(clean: Path) -> None:
    (clean / "broker/keys.py").write_text("import broker\n")
    assert circle(import_graph(clean)) == ["broker", "broker.keys"]
