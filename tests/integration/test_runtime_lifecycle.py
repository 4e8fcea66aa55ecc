"""A real job (torchrun, two tiny-gpt ranks over loopback: no namespaces) lives and dies with
`shardsim run`: a stopped rank ends the job within --timeout + 5 s and is named; SIGKILL to
the launcher leaves no process and no result; Ctrl-C and SIGTERM end it at once with one line
(130, 143) and nothing left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardsim.runtime.processes import alive, descendants
from tests.helpers import gone_within

ROOT = Path(__file__).resolve().parents[2]
RUN = ["run", "--topology", "emu-2x2", "--workload", "tiny-gpt", "--nproc", "2", "--strategy", "ddp"]


def _start(tmp_path: Path, *args: str, fault: str = "") -> subprocess.Popen:
    """`shardsim -q run ...` in a session of its own (as a terminal's job), its run folder under
    `tmp_path` (TMPDIR) so that the test can follow the ranks' steps."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "SHARDSIM_FAULT": fault}
    cmd = [sys.executable, "-m", "shardsim.cli", "-q", *RUN, "--out", str(tmp_path / "out"), *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_training(proc: subprocess.Popen, tmp_path: Path, timeout_s: float = 180) -> list[int]:
    """Wait until rank 0 is past its first step; returns torchrun and the ranks (their pids)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        for step in tmp_path.glob("shardsim-run-*/rank0.step"):
            text = step.read_text().strip()
            if text and int(text) >= 1:
                return descendants(proc.pid)
        time.sleep(0.1)
    raise AssertionError("the ranks did not start training")


@pytest.fixture
def reaper():
    """Kills what a failing test left running."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_stopped_rank_ends_the_job_within_the_timeout_and_is_named(tmp_path, reaper):
    timeout = 8
    proc = _start(tmp_path, "--steps", "6", "--timeout", str(timeout), fault="stop@1:2")
    reaper.append(proc.pid)
    stopped_at, lines = None, []
    for line in proc.stderr:
        lines.append(line.rstrip())
        if "stops itself" in line:
            stopped_at = time.monotonic()
            reaper.extend(descendants(proc.pid))
    proc.wait()
    ended = time.monotonic() - stopped_at
    print(f"stopped rank -> job ended: {ended:.1f} s (--timeout {timeout})")
    assert proc.returncode == 1
    assert lines[-1].startswith("shardsim: run failed: rank 1 stopped responding at step 2: rank 0 timed out after 8 s")
    # the promise is --timeout + 5 s (measured about + 3); torchrun alone waits 30 s more for a stopped rank
    assert ended < timeout + 5 + 5, ended
    assert gone_within(reaper[1:], 5)
    assert not (tmp_path / "out" / "runs.csv").exists()
    assert not list(tmp_path.glob("shardsim-run-*")) and not list(tmp_path.glob("torchelastic_*"))


def test_sigkill_to_the_launcher_ends_every_process_of_the_job_and_writes_nothing(tmp_path, reaper):
    proc = _start(tmp_path, "--steps", "2000", "--warmup", "0")
    reaper.append(proc.pid)
    job = _wait_training(proc, tmp_path)
    reaper.extend(job)
    assert len(job) >= 3  # torchrun and two ranks
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert gone_within(job, 10), [p for p in job if alive(p)]
    print(f"launcher killed -> its job gone: {time.monotonic() - t0:.2f} s")
    out = tmp_path / "out"
    assert not list(out.glob("*.json")) and not (out / "runs.csv").exists()


@pytest.mark.parametrize(("sig", "status", "line"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")])
def test_a_signal_ends_the_job_at_once_with_one_line(tmp_path, reaper, sig, status, line):
    proc = _start(tmp_path, "--steps", "2000", "--warmup", "0")
    reaper.append(proc.pid)
    job = _wait_training(proc, tmp_path)
    reaper.extend(job)
    t0 = time.monotonic()
    if sig == "SIGINT":
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals its foreground process group
    else:
        os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    took = time.monotonic() - t0
    print(f"{sig} -> exit: {took:.2f} s")
    assert gone_within(job, 2)  # before reading: a rank left running would hold stderr open
    assert (proc.returncode, proc.stderr.read()) == (status, f"shardsim: {line}\n")
    assert took < 2 + 2, took  # the promise is 2 s; measured about 0.2 s
    assert not list(tmp_path.glob("shardsim-run-*")) and not list(tmp_path.glob("torchelastic_*"))


def test_ctrl_c_on_profile_ends_it_and_its_forked_workers_at_once(tmp_path, reaper):
    """`profile` times core sharing in forked processes: Ctrl-C reaches the profile only (one
    line), which kills them, instead of a traceback from each."""
    cmd = [sys.executable, "-m", "shardsim.cli", "-q", "profile", "--workload", "tiny-gpt"]
    cmd += ["--topology", "emu-2x2", "--no-links", "--out", str(tmp_path / "prof")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
    reaper.append(proc.pid)
    deadline = time.monotonic() + 180
    while not (workers := descendants(proc.pid)):
        assert proc.poll() is None and time.monotonic() < deadline, "no forked worker started"
        time.sleep(0.05)
    reaper.extend(workers)
    time.sleep(0.5)  # inside their work
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=30)
    took = time.monotonic() - t0
    print(f"profile: SIGINT -> exit: {took:.2f} s")
    assert gone_within(workers, 2)
    assert (proc.returncode, proc.stderr.read()) == (130, "shardsim: interrupted\n")
    assert took < 2 + 2, took  # the promise is 2 s; measured about 0.3 s
