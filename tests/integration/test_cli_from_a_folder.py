"""The installed CLI from a folder holding its own `topologies/` (and `simulator/`, `runtime/`):
nothing built in is shadowed, and a user's own model module beside them is found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SHARDSIM = str(Path(sys.executable).parent / "shardsim")


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
        "from shardsim.runtime.models.builders import build_model\n"
        "from shardsim.specs.model.library import PRESETS\n\n\n"
        "def build():\n    return build_model(PRESETS['tiny-gpt'])\n"
    )
    argv = [SHARDSIM, "sweep", "--workload", "mymodel:build", "--topology", "p5.48xlarge", "--nodes", "1"]
    argv += ["--strategies", "ddp,zero", "--workers", "1", "--no-progress", "--json"]
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert {r["strategy"]["kind"] for r in json.loads(out.stdout)["rows"]} == {"ddp", "zero"}
