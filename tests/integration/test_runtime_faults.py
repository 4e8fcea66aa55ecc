"""A rank that dies or hangs ends the whole job within a bounded time, with one line naming
the rank; no process is left behind; results written before stay intact."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardsim.runtime.records import CSV_NAME, write_run
from tests.helpers import run_record

ROOT = Path(__file__).resolve().parents[2]


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text` (the run's unique --out folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def _run_with_fault(tmp_path: Path, fault: str, timeout_s: float, world: int = 2, strategy=("--strategy", "ddp")):
    out = tmp_path / "out"
    # results of an earlier run, which a failed run must leave as they are
    write_run(run_record(run_id="earlier"), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    cmd = [sys.executable, "-m", "shardsim.cli", "run", "--topology", "emu-2x2", "--workload", "tiny-mlp",
           "--nproc", str(world), *strategy, "--steps", "3", "--warmup", "1", "--timeout", str(timeout_s),
           "--out", str(out)]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, env={**os.environ, "SHARDSIM_FAULT": fault}
    )
    stderr, stopped = [], None
    for line in proc.stderr:  # the ranks' lines too: the time a rank stopped itself (fault stop)
        stderr.append(line)
        if "stops itself" in line:
            stopped = time.monotonic()
    proc.wait(timeout=240)
    wall = time.monotonic() - t0
    err = "".join(stderr)
    assert proc.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("shardsim: run failed: "), err[-3000:]
    assert _processes_mentioning(str(out)) == []
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert after == before  # nothing new, nothing torn
    assert [r["run_id"] for r in csv.DictReader(open(out / CSV_NAME))] == ["earlier"]
    if stopped is not None:
        wall = time.monotonic() - stopped  # from the fault on
    return last, wall


def test_killed_rank_ends_the_job_and_is_named(tmp_path):
    last, wall = _run_with_fault(tmp_path, "kill@1:2", timeout_s=20)
    assert "rank 1 (pid " in last and "died at step 2" in last and "signal" in last, last
    assert wall < 60  # no waiting for the 20 s timeout: the peers see the connection close


def test_hung_rank_ends_the_job_within_the_timeout_and_is_named(tmp_path):
    last, wall = _run_with_fault(
        tmp_path, "hang@1:2", timeout_s=3, world=4, strategy=("--strategy", "zero2d", "--degree", "2")
    )
    assert "rank 1 stopped responding at step 2" in last and "timed out after 3 s" in last, last
    assert wall < 60


def test_stopped_rank_in_the_emulated_cluster_is_killed_within_the_timeout(tmp_path):
    """A stopped rank (SIGSTOP: deaf to torchrun's SIGTERM, as one stuck in the kernel) is
    killed once its peers time out: the job ends within --timeout + 5 s (measured + 2.2 s), not
    after torchrun's 30-s grace on top."""
    timeout = 8
    last, since_stop = _run_with_fault(
        tmp_path, "stop@1:2", timeout_s=timeout, world=4, strategy=("--strategy", "zero2d", "--degree", "2")
    )
    print(f"emulated: stopped rank -> job ended: {since_stop:.1f} s (--timeout {timeout})")
    assert "rank 1 stopped responding at step 2" in last and f"timed out after {timeout} s" in last, last
    assert since_stop < timeout + 5 + 5, since_stop


@pytest.mark.slow  # the diagnosis itself is unit-tested in test_runtime.py
def test_crashing_rank_is_named_with_its_error(tmp_path):
    last, _ = _run_with_fault(tmp_path, "raise@0:1", timeout_s=20)
    assert "rank 0 failed at step 1: RuntimeError: injected fault at step 1" in last, last
