"""The layout's promises: the simulator never imports the runtime, no module is imported from a
string, every package is installed, and a user's own `topologies/` folder shadows nothing."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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


def test_the_cli_works_from_a_folder_with_its_own_topologies(tmp_path):
    """A `topologies/` (and a `simulator/`) in the working directory shadow nothing built in."""
    for name in ("topologies", "simulator", "runtime"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / "topologies" / "mine.yaml").write_text("name: mine\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    argv = [SHARDSIM, "predict", "--topology", "p5.48xlarge", "--nodes", "1", "--json"]
    out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["world"] == 8
    listing = subprocess.run([SHARDSIM, "topologies"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "p5.48xlarge" in listing.stdout and "mine" not in listing.stdout


def test_a_sweep_of_the_users_own_model_from_such_a_folder(tmp_path):
    """The user's model module sits beside their own `topologies/` folder (as a project would)."""
    (tmp_path / "topologies").mkdir()
    (tmp_path / "topologies" / "__init__.py").write_text("")
    (tmp_path / "mymodel.py").write_text(
        "from shardsim.runtime.models.transformer import build_model\n"
        "from shardsim.simulator.workload.model import PRESETS\n\n\n"
        "def build():\n    return build_model(PRESETS['tiny-gpt'])\n"
    )
    argv = [SHARDSIM, "sweep", "--workload", "mymodel:build", "--topology", "p5.48xlarge", "--nodes", "1"]
    argv += ["--strategies", "ddp,zero", "--workers", "1", "--no-progress", "--json"]
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert {r["strategy"] for r in json.loads(out.stdout)["rows"]} == {"ddp", "zero"}
