"""The layout's promises: one package folder whose paths are its import names; the layers import
downwards only (core, data ← specs ← config ← simulator ← sweep, report ← runtime ← cli, and the
public API on top), and none imports the package itself; no import circle among the modules; no
module is imported from a string; the installed wheel holds every module and every data file."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "shardsim"
# The layers, lowest first: a layer imports only those below it (and those of its own level);
# the public API (shardsim/__init__.py, shardsim/api.py, shardsim/__main__.py) stands on top.
LEVELS = {
    "core": 0,
    "data": 0,
    "specs": 1,
    "config": 2,
    "simulator": 3,
    "sweep": 4,
    "report": 4,
    "runtime": 5,
    "cli": 6,
    "api": 6,
}
# Modules that import `shardsim` itself (its __init__, the public API) from inside the package: none may.
KNOWN_TOP_IMPORTS: set[str] = set()


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def layer_of(parts: tuple[str, ...]) -> str:
    """The layer of a module, from its path under shardsim/ or its dotted name after `shardsim`."""
    if not parts or parts[0] not in LEVELS:
        return "api"  # shardsim itself, __init__.py, __main__.py
    return parts[0]


def climbs(path: Path, package: Path = PACKAGE) -> list[str]:
    """The imports of `path` (a module of `package`) that name a layer above its own."""
    own = layer_of(path.relative_to(package).with_suffix("").parts)
    out = []
    for name in _imports(path):
        parts = tuple(name.split("."))
        if parts[0] != "shardsim" or len(parts) < 2:
            continue
        target = layer_of(parts[1:])
        if LEVELS[target] > LEVELS[own]:
            out.append(f"{path.relative_to(package.parent)}: {name}")
    return out


def test_layers_import_downwards_only():
    offenders = [c for p in _sources() for c in climbs(p)]
    assert not offenders


def test_a_climb_is_seen(tmp_path):
    """An upward import is caught (config → simulator, simulator → its sweep), a downward one passes."""
    package = tmp_path / "shardsim"
    (package / "config").mkdir(parents=True)
    (package / "simulator").mkdir()
    (package / "config" / "m.py").write_text("from shardsim.simulator.engine import x\nfrom shardsim.specs import y\n")
    (package / "simulator" / "m.py").write_text("from shardsim.sweep.space import x\nimport shardsim.config\n")
    assert climbs(package / "config" / "m.py", package) == ["shardsim/config/m.py: shardsim.simulator.engine"]
    assert climbs(package / "simulator" / "m.py", package) == ["shardsim/simulator/m.py: shardsim.sweep.space"]


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith("TYPE_CHECKING")


def _imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, tuple[str, ...]]]:
    """Every import statement of `tree` as (module it names, the names it takes from it), at
    module level and inside functions and classes, except under ``if TYPE_CHECKING:`` (never
    run); a relative import resolved against `module`."""
    out: list[tuple[str, tuple[str, ...]]] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            out += [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".")
            if node.level:
                base = base[: len(base) - node.level + is_package]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            out.append((name, tuple(a.name for a in node.names)))
        if _is_type_checking(node):
            todo += node.orelse  # type: ignore[attr-defined]
        else:
            todo += ast.iter_child_nodes(node)
    return out


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of `package` and the package's modules it imports: ``import a.b`` and ``from a
    import b`` name ``a.b`` where it is a module, ``from a.b import name`` names ``a.b``. A module
    reaches a package's __init__ only by importing the package by its name."""
    paths = {_module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges = set()
        for target, names in _imported(ast.parse(path.read_text()), name, path.name == "__init__.py"):
            for t in [f"{target}.{n}" for n in names if f"{target}.{n}" in paths] or [target]:
                while t and t not in paths:  # import a.b.c of a module a.b that defines c
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circle_among_the_modules():
    """No module reaches itself through the imports of others, counting the imports inside
    functions (they run too) and leaving out those under ``if TYPE_CHECKING:`` (they never do)."""
    assert circles(import_graph()) == []


def test_a_circle_is_seen(tmp_path):
    """A circle closed by an import inside a function is one; one closed under TYPE_CHECKING is not."""
    package = tmp_path / "shardsim"
    (package / "config").mkdir(parents=True)
    (package / "config" / "__init__.py").write_text("from shardsim.config.a import x\n")
    (package / "config" / "a.py").write_text("from shardsim.config.b import y\nx = 1\n")
    (package / "config" / "b.py").write_text("def y():\n    from shardsim.config import a\n")
    (package / "config" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import a\nif TYPE_CHECKING:\n    from .d import z\n"
    )
    (package / "config" / "d.py").write_text("from shardsim.config.c import a\nz = 1\n")
    graph = import_graph(package)
    assert graph["shardsim.config.b"] == {"shardsim.config.a"}
    assert graph["shardsim.config.c"] == {"shardsim.config.a"}
    assert circles(graph) == [["shardsim.config.a", "shardsim.config.b"]]


def test_no_module_imports_the_package_itself():
    """`from shardsim import ...` inside the package ties a layer to the public API on top."""
    offenders = {
        str(p.relative_to(ROOT))
        for p in _sources()
        if p.parent != PACKAGE and any(name == "shardsim" for name in _imports(p))
    }
    assert offenders <= KNOWN_TOP_IMPORTS, sorted(offenders - KNOWN_TOP_IMPORTS)


# The simulator's modules the sweep and the report may import (shardsim/simulator/__init__.py lists
# them): its public functions and the descriptions it is given, none of its internals.
SIMULATOR_FACE = {
    "shardsim.simulator",
    "shardsim.simulator.predict",
    "shardsim.simulator.bounds",
    "shardsim.simulator.results",
    "shardsim.simulator.economics",
    "shardsim.simulator.model_error",
    "shardsim.simulator.gcpause",
    "shardsim.simulator.calibration.apply",
    "shardsim.simulator.hardware.profile",
    "shardsim.simulator.scale",
    "shardsim.simulator.attention_impl",
    "shardsim.simulator.workload.resolve",
}


def test_the_sweep_and_the_report_use_the_simulators_public_modules_and_names_only():
    offenders = []
    for p in [*sorted((PACKAGE / "sweep").rglob("*.py")), *sorted((PACKAGE / "report").rglob("*.py"))]:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                found = [(a.name, "") for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                found = [(node.module, a.name) for a in node.names]
            else:
                continue
            for module, name in found:
                if module.startswith("shardsim.simulator") and (module not in SIMULATOR_FACE or name.startswith("_")):
                    offenders.append(f"{p.relative_to(ROOT)}: {module} {name}".rstrip())
    assert not offenders


def test_every_import_path_is_a_file_path():
    """`shardsim.a.b` is shardsim/a/b.py or shardsim/a/b/: nothing is mapped elsewhere."""
    missing = []
    for p in [*_sources(), *ROOT.glob("tests/**/*.py"), *ROOT.glob("experiments/**/*.py")]:
        for name in _imports(p):
            if name.split(".")[0] != "shardsim":
                continue
            target = ROOT.joinpath(*name.split("."))
            # a folder: a package (its __init__.py), or one without (shardsim/sweep/ until it has one)
            folder = target.is_dir() and any(target.glob("*.py"))
            if not (target.with_suffix(".py").is_file() or folder):
                # `from shardsim.x import y` where y is a name, not a module: x must exist
                missing.append(f"{p.relative_to(ROOT)}: {name}")
    assert not missing


def test_modules_are_imported_by_name_not_from_strings():
    """`import_module` and `__import__` only where a user names their own model (pkg.module:fn)."""
    allowed = {PACKAGE / "specs" / "model" / "importpath.py"}
    offenders = [
        str(p.relative_to(ROOT))
        for p in _sources()
        if p not in allowed and ("import_module(" in p.read_text() or "__import__(" in p.read_text())
    ]
    assert not offenders


def test_the_code_imports_shardsim_names_only():
    """Bare `simulator`/`runtime` imports would load a user's folder of that name."""
    bare = {"simulator", "runtime", "topologies", "core", "cli", "config", "data"}
    offenders = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in [*_sources(), *ROOT.glob("tests/**/*.py"), *ROOT.glob("experiments/**/*.py")]
        for name in _imports(p)
        if name.split(".")[0] in bare
    ]
    assert not offenders


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_data_file(tmp_path):
    import subprocess
    import sys

    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("shardsim-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts
    }
    assert expected <= names, sorted(expected - names)
