"""What a real run writes (torchrun, gloo, CPU): its record says the backend that ran, its
runs.csv row carries the spread of the steps (step_time_std_s), and its files have the mode
every shardsim output has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from shardsim.runtime.records import CSV_NAME, read_runs_csv
from shardsim.simulator.files import file_mode

ROOT = Path(__file__).resolve().parents[2]


def test_a_gpu_topology_run_on_cpu_records_gloo_its_std_and_the_common_mode(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "shardsim.runtime.cli", "run", "--topology", "p4d.24xlarge", "--nproc", "2",
           "--workload", "tiny-gpt", "--steps", "3", "--warmup", "0", "--out", str(out), "--json"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads(proc.stdout)
    assert rec["backend"] == "gloo" and rec["config"]["backend"] == "gloo"  # the topology asks for nccl
    _, rows = read_runs_csv(out / CSV_NAME)
    assert float(rows[0]["step_time_std_s"]) == rec["step_time_std_s"] > 0
    for name in (f"{rec['run_id']}.json", CSV_NAME):
        assert os.stat(out / name).st_mode & 0o777 == file_mode()
