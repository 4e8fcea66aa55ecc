"""The layout's promises: the simulator never imports the runtime, no module is imported from a
string, only `shardsim.` names are imported, and every package folder is installed."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARDSIM = str(Path(sys.executable).parent / "shardsim")
FOLDERS = ("simulator", "runtime", "topologies")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def _sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_the_simulator_never_imports_the_runtime():
    offenders = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in _sources("simulator")
        for name in _imports(p)
        if name == "shardsim.runtime" or name.startswith("shardsim.runtime.")
    ]
    assert not offenders


def test_modules_are_imported_by_name_not_from_strings():
    """`import_module` and `__import__` only where a user names their own model (pkg.module:fn)."""
    allowed = {ROOT / "simulator" / "workload" / "importpath.py"}
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("simulator", "runtime")
        for p in _sources(folder)
        if p not in allowed and ("import_module(" in p.read_text() or "__import__(" in p.read_text())
    ]
    assert not offenders


def test_the_code_imports_shardsim_names_only():
    """Bare `simulator`/`runtime` imports would load a second copy (or a user's folder of that name)."""
    offenders = [
        f"{p.relative_to(ROOT)}: {name}"
        for folder in (*FOLDERS, "tests", "experiments")
        for p in _sources(folder)
        for name in _imports(p)
        if name.split(".")[0] in FOLDERS
    ]
    assert not offenders


def test_every_package_folder_is_installed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        "shardsim." + ".".join(p.parent.relative_to(ROOT).parts)
        for folder in FOLDERS
        for p in (ROOT / folder).rglob("__init__.py")
    }
    assert listed == found
