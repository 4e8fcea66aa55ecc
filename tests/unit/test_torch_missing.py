"""Without torch, every command that needs it says in one line what to install, exit status 2,
before anything starts; the commands that do not need it still work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardsim.core.torch_required import TORCH_VERSION

ROOT = Path(__file__).resolve().parents[2]
NEEDS_TORCH = {
    "run": ["run", "--topology", "emu-2x2", "--no-emulate", "--nproc", "2", "--workload", "tiny-gpt"],
    "profile": ["profile", "--workload", "tiny-gpt", "--topology", "emu-2x2", "--no-links"],
    "validate": ["validate", "--matrix", "runtime/validation/matrices/ci.yaml"],
    "import path (predict)": ["predict", "--workload", "tests.fixtures_models:build_tiny_gpt"],
    "import path (sweep)": ["sweep", "--workload", "tests.fixtures_models:build_tiny_gpt", "--strategies", "ddp"],
}


def _without_torch(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """`shardsim ARGV` in a Python where `import torch` fails as if it were not installed."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None  # torch is not installed\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "SHARDSIM_LOG_DIR": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "shardsim.cli", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize("argv", NEEDS_TORCH.values(), ids=NEEDS_TORCH.keys())
def test_a_command_that_needs_torch_says_what_to_install(tmp_path: Path, argv: list[str]):
    proc = _without_torch(tmp_path, [a if not a.startswith("runtime/") else str(ROOT / a) for a in argv])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"-m pip install torch=={TORCH_VERSION} --index-url https://download.pytorch.org/whl/cpu" in lines[0]
    assert "needs PyTorch" in lines[0] and proc.stdout == ""
    assert not (tmp_path / "results").exists()  # nothing started, nothing written


def test_the_simulator_runs_without_torch(tmp_path: Path):
    proc = _without_torch(
        tmp_path, ["predict", "--workload", "tiny-gpt", "--topology", "emu-2x2", "--backend", "gloo", "--json"]
    )
    assert proc.returncode == 0, proc.stderr
    assert '"step_time_s"' in proc.stdout
