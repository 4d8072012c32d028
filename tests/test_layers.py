"""The layers of docs/architecture.md hold: every import in src/enkflow, function-level ones included, goes to
the importer's own layer or one before it, and function-level imports are kept for heavy optional
dependencies only, each with its reason on the line."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "enkflow"

# The order of docs/architecture.md ("Layers"): a module may import its own layer and those before it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "fsutil", "netaddr", "shm_names", "transport", "tokens", "job_thread", "progress", "config"),
    ("parallel",),
    ("state",),
    ("analysis",),
    ("obs",),
    ("io",),
    ("models",),
    ("jobs",),
    ("output",),
    ("experiment",),
    ("online",),
    ("report",),
    ("bench",),
    ("apps",),
    ("cli", "__main__"),
)
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}

# What may be imported inside a function, and why (measured with numpy already loaded; each import line
# says its own reason too): heavy dependencies that most processes importing the module never use.
LAZY_OK: dict[str, str] = {
    "matplotlib": "about 0.35 s with pyplot; only `enkflow report --html` draws figures",
    "mpi4py": "60 ms and initialises MPI; a process that no MPI launcher started runs serial without it",
    "netCDF4": "35 ms; a model's process writing through enkflow.output (its client) loads no netCDF library",
    "h5py": "21-25 ms (+25 ms at every output writer's start); only a window's checkpoint and NetCDF-4 restarts' "
            "structure are HDF5",
    "importlib.metadata": "35 ms in every process importing enkflow; only `enkflow --version` reads it",
    "xarray": "optional (the dev extra), 0.3 s; only `enkflow bench io` compares with it",
    "numba": "0.26 s and a JIT; only byte-swapped restart files need its kernels",
    "scipy.optimize": "80 ms (numpy and scipy.linalg loaded) in every server, analysis task and Lorenz-96 run; "
                      "only EnKF-N's inflation search (Brent's method) uses it",
}


def _under(target: str, name: str) -> bool:
    return target == name or target.startswith(name + ".")


def _lazy_ok(target: str) -> bool:
    return any(_under(target, name) for name in LAZY_OK)


@dataclass(frozen=True)
class Import:
    """One import statement: the module that holds it, what it names, where, and whether it is in a function."""

    module: str  # dotted, e.g. "enkflow.online.server"
    target: str  # dotted, absolute
    line: int
    in_function: bool
    source_line: str


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(text: str, module: str, is_package: bool = False) -> list[Import]:
    lines = text.splitlines()
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(module, a.name, child.lineno, in_function, lines[child.lineno - 1])
                             for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                target = _absolute(module, is_package, child)
                found.append(Import(module, target, child.lineno, in_function, lines[child.lineno - 1]))
            visit(child, inside)

    visit(ast.parse(text, module), False)
    return found


def _layer(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


ALL = [imp for p in sorted(SRC.rglob("*.py")) for imp in _imports(p.read_text(), _module_name(p), p.name == "__init__.py")]


def test_the_reader_found_the_package() -> None:
    assert len(ALL) > 300, SRC


def test_every_package_has_a_layer() -> None:
    top = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
           if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert sorted(top - RANK.keys()) == [], "add the new package or module to LAYERS and docs/architecture.md"


def test_no_import_against_the_layer_order() -> None:
    upward = [f"{i.module}:{i.line} imports {i.target} ({_layer(i.module)} may not import {_layer(i.target)})"
              for i in ALL
              if i.target.startswith("enkflow.") and _layer(i.module) in RANK and _layer(i.target) in RANK
              and RANK[_layer(i.target)] > RANK[_layer(i.module)]]
    assert upward == []


def test_function_level_imports_are_heavy_dependencies_with_a_reason() -> None:
    bad = [f"{i.module}:{i.line}: {i.source_line.strip()}" for i in ALL
           if i.in_function and not (_lazy_ok(i.target) and "#" in i.source_line)]
    assert bad == [], "import at module level, or keep a heavy optional dependency lazy with '# why' on the line"


def test_every_lazy_dependency_is_still_imported_lazily() -> None:
    """LAZY_OK stays the list of what is really needed."""
    lazy = {name for name in LAZY_OK for i in ALL if i.in_function and _under(i.target, name)}
    assert sorted(LAZY_OK.keys() - lazy) == []


@pytest.mark.parametrize("source, expected, in_function", [
    ("from enkflow.online import server\n", "enkflow.online", False),
    ("import enkflow.online.server\n", "enkflow.online.server", False),
    ("def f():\n    from ..online import server\n", "enkflow.online", True),
    ("class C:\n    def f(self):\n        from . import ring\n", "enkflow.jobs", True),
])
def test_the_reader_sees_every_form(source: str, expected: str, in_function: bool) -> None:
    """The checks above cannot pass by missing a form of import (module level, in a method, relative)."""
    imports = _imports(source, "enkflow.jobs.probe")
    assert [(i.target, i.in_function) for i in imports] == [(expected, in_function)]
