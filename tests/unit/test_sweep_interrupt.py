"""Ctrl-C on a sweep: the terminal sends SIGINT to the whole process group;
the sweep ends at once with one line and status 130, its worker processes with it. A hangup
(the terminal closed: SIGHUP to the group) the same way, with status 129."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Ctrl-C (or SIGTERM, SIGHUP, SIGQUIT) ends any command within 2 s, every process it started
# with it: docs/configuration.md (exit status 130) and docs/simulator.md ("Progress and Ctrl-C").
CTRL_C_PROMISE_S = 2.0


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _cpu_ticks(pid: int) -> int:
    """User + system clock ticks a process has run (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0
    return int(fields[11]) + int(fields[12])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize(
    ("sig", "status", "line"), [("SIGINT", 130, "interrupted"), ("SIGHUP", 129, "terminated (SIGHUP)")]
)
def test_ctrl_c_ends_a_sweep_and_its_workers_at_once(sig, status, line) -> None:
    # eight ZeRO-2D configurations of 220 micro-steps (about 92,000 ops each: seconds per prediction)
    sweep = "sweep --strategies zero2d --degrees 2,4,8,16 --grad-accum 220 --checkpointing none,full"
    argv = [sys.executable, "-m", "shardsim.cli", *sweep.split(), "--workers", "2", "--no-progress"]
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(_children(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        workers = _children(proc.pid)
        assert len(workers) == 2, "the sweep did not start its two workers"
        while not all(_cpu_ticks(w) > 20 for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)  # both are predicting
        os.killpg(proc.pid, signal.Signals[sig])  # what a terminal's Ctrl-C (or hangup) does
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(f"Ctrl-C -> exit {took:.2f} s")
    assert proc.returncode == status
    assert err == f"shardsim: {line}\n", err
    assert took < CTRL_C_PROMISE_S, f"exited {took:.1f} s after Ctrl-C"
    gone = time.monotonic() + 2
    while any(Path(f"/proc/{w}").exists() for w in workers) and time.monotonic() < gone:
        time.sleep(0.05)
    assert not [w for w in workers if Path(f"/proc/{w}").exists()], "a worker outlived the sweep"
