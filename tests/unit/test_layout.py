"""The layout's promises: one package folder whose paths are its import names; the layers import
downwards only (core ← spec ← config ← simulator ← runtime ← cli, and the public API on top); no module is
imported from a string; the installed wheel holds every module and every data file."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "shardsim"
# What each layer may import from shardsim (besides itself); the public API (shardsim/__init__.py
# and shardsim/api.py) may import everything.
MAY_IMPORT = {
    "core": set(),
    "data": set(),
    "spec": {"core"},
    "config": {"core", "data", "spec", "simulator"},
    "simulator": {"core", "data", "spec", "config"},
    "runtime": {"core", "data", "spec", "config", "simulator"},
    "cli": {"core", "data", "spec", "config", "simulator", "runtime", "api"},
}


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


def test_layers_import_downwards_only():
    offenders = []
    for p in _sources():
        layer = p.relative_to(PACKAGE).parts[0]
        if layer not in MAY_IMPORT:
            continue
        for name in _imports(p):
            parts = name.split(".")
            if parts[0] == "shardsim" and len(parts) > 1 and parts[1] != layer:
                if parts[1] not in MAY_IMPORT[layer]:
                    offenders.append(f"{p.relative_to(ROOT)}: {name}")
    assert not offenders


def test_every_import_path_is_a_file_path():
    """`shardsim.a.b` is shardsim/a/b.py or shardsim/a/b/: nothing is mapped elsewhere."""
    missing = []
    for p in [*_sources(), *ROOT.glob("tests/**/*.py"), *ROOT.glob("experiments/**/*.py")]:
        for name in _imports(p):
            if name.split(".")[0] != "shardsim":
                continue
            target = ROOT.joinpath(*name.split("."))
            if not (target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()):
                # `from shardsim.x import y` where y is a name, not a module: x must exist
                missing.append(f"{p.relative_to(ROOT)}: {name}")
    assert not missing


def test_modules_are_imported_by_name_not_from_strings():
    """`import_module` and `__import__` only where a user names their own model (pkg.module:fn)."""
    allowed = {PACKAGE / "simulator" / "workload" / "importpath.py"}
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
