"""CPU tier: the source layout. The packages at the repository root install under `cutegen` as
pyproject.toml maps them, import one another only along the documented arrows, never in a cycle,
and never as a bare top-level `gen` or `runtime`."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGE_DIRS: dict[str, str] = SETUPTOOLS["package-dir"]
TOP_PACKAGES = {name: folder for name, folder in PACKAGE_DIRS.items() if name.count(".") == 1}

# Which package may import which (docs/architecture.md): runtime and schedules import nothing of the
# project; the CLI in gen drives the benchmark.
ALLOWED = {
    "cutegen.schedules": set(),
    "cutegen.runtime": set(),
    "cutegen.templates": {"cutegen.schedules"},
    "cutegen.deep_gemm": {"cutegen.runtime"},
    "cutegen.bench": {"cutegen.runtime", "cutegen.deep_gemm", "cutegen.schedules"},
    "cutegen.gen": {"cutegen.schedules", "cutegen.templates", "cutegen.runtime", "cutegen.deep_gemm", "cutegen.bench"},
}


def project_modules() -> dict[str, tuple[Path, bool]]:
    """Every project module by its installed name: (source file, is a package's __init__)."""
    modules = {}
    for package, folder in TOP_PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            modules[".".join([package, *parts])] = (path, path.name == "__init__.py")
    return modules


def imports_of(name: str, path: Path, is_package: bool) -> set[str]:
    """The module names `path` imports, relative imports resolved, at any depth (lazy ones too)."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: {m for m in imports_of(name, *info) if m in modules and m != name} for name, info in modules.items()}


def test_every_package_folder_is_mapped_and_installed():
    """Each folder with an __init__.py under a mapped root is in `packages` with its folder, so that no
    subpackage is left out of a wheel; `cutegen` itself is a namespace."""
    packages = set(SETUPTOOLS["packages"])
    assert "cutegen" not in packages and not (ROOT / "cutegen").exists()
    for package, folder in TOP_PACKAGES.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            sub = init.parent.relative_to(ROOT / folder).parts
            name = ".".join([package, *sub])
            assert name in packages, f"{init.parent} is not installed: add {name} to pyproject.toml"
            assert PACKAGE_DIRS[name] == "/".join([folder, *sub])


def test_packages_import_along_the_documented_arrows(graph):
    package_of = lambda m: ".".join(m.split(".")[:2])  # noqa: E731
    wrong = sorted(f"{m} imports {t}" for m, targets in graph.items() for t in targets
                   if package_of(t) != package_of(m) and package_of(t) not in ALLOWED[package_of(m)])
    assert not wrong, wrong


def test_no_module_imports_itself_back(graph):
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_nothing_imports_a_folder_by_its_bare_name():
    """`import runtime` works from the repository root by accident of sys.path; no code relies on it."""
    bare = {folder.split("/")[0] for folder in TOP_PACKAGES.values()}
    wrong = []
    for name, (path, is_package) in project_modules().items():
        wrong += [f"{path.relative_to(ROOT)}: {m}" for m in imports_of(name, path, is_package) if m.split(".")[0] in bare]
    assert not wrong, wrong
