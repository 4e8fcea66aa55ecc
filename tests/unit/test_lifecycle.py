"""A job's processes live and die with the launcher: a hung rank is killed once its peers name
it, every process ends with the one that started it, no result is written for a launcher that
is gone, and SIGINT / SIGTERM end a command with one line and 130 / 143. Fast: no torch, no
torchrun (a stand-in plays it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shardsim.core.interrupts import Terminated, exit_status
from shardsim.runtime import launch as launcher
from shardsim.runtime.emulation import namespaces
from shardsim.runtime.launch import RankView, failed_ranks
from shardsim.runtime.processes import LAUNCHER_ENV, ProcessRef, alive, descendants, kill_tree
from shardsim.runtime.train import check_launcher
from tests.helpers import gone_within

ROOT = Path(__file__).resolve().parents[2]
HUNG_RANK_S = 5.0  # docs/runtime.md: a hung rank ends the job within `--timeout` + 5 s


def _python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, **kwargs)


def test_a_process_ref_tells_a_reused_pid_apart():
    me = ProcessRef.of(os.getpid())
    assert me is not None and me.alive()
    assert ProcessRef.parse(str(me)) == me
    assert not ProcessRef(me.pid, me.start + 1).alive()  # the same pid, another process
    assert ProcessRef.parse("garbage") is None and ProcessRef.parse(None) is None
    sleeper = subprocess.Popen(["sleep", "60"])
    ref = ProcessRef.of(sleeper.pid)
    assert not ProcessRef(ref.pid, ref.start + 1).kill()  # not that process: no signal
    assert sleeper.poll() is None
    assert ref.kill()
    assert sleeper.wait(timeout=5) == -signal.SIGKILL
    assert not ref.kill()  # gone


def test_kill_tree_ends_a_process_and_everything_below_it():
    root = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & sh -c 'sleep 60; true' & wait"])
    deadline = time.monotonic() + 10
    while len(descendants(root.pid)) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    below = descendants(root.pid)
    assert len(below) >= 4
    kill_tree(root.pid)
    assert root.wait(timeout=5) == -signal.SIGKILL
    assert gone_within(below, 5)


def test_a_child_dies_with_its_parent():
    """torchrun's guard: the parent-death signal (what the launcher sets before exec)."""
    parent = _python(
        """
        import subprocess, sys, time
        from shardsim.runtime.processes import die_with_parent
        child = subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent)
        print(child.pid, flush=True)
        time.sleep(60)
        """,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    assert gone_within([child], 5)


def test_a_rank_ends_when_its_launcher_is_gone(tmp_path):
    """The ranks' guard: they are torchrun's children, not the launcher's, so they watch it."""
    shardsim = subprocess.Popen(["sleep", "60"])  # stands in for the launcher
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**os.environ, LAUNCHER_ENV: str(ProcessRef.of(shardsim.pid)), "SHARDSIM_RUN_DIR": str(run_dir)}
    rank = _python(
        """
        import time
        from shardsim.runtime.train import follow_launcher
        follow_launcher()
        time.sleep(60)
        """,
        env=env,
    )
    time.sleep(1.0)
    assert rank.poll() is None  # it runs while the launcher does
    shardsim.kill()
    shardsim.wait()
    assert rank.wait(timeout=10) == -signal.SIGKILL
    assert not run_dir.exists()  # the run's status folder goes with it


def test_no_result_is_written_for_a_launcher_that_is_gone(monkeypatch):
    gone = subprocess.Popen(["true"])
    ref = ProcessRef.of(gone.pid) or ProcessRef(gone.pid, 0)
    gone.wait()
    monkeypatch.setenv(LAUNCHER_ENV, str(ref))
    with pytest.raises(RuntimeError, match="has ended; no result is written"):
        check_launcher()
    monkeypatch.setenv(LAUNCHER_ENV, str(ProcessRef.of(os.getpid())))
    check_launcher()  # alive: write
    monkeypatch.delenv(LAUNCHER_ENV)
    check_launcher()  # plain torchrun: nothing to check


def test_a_failing_job_is_seen_from_the_first_report_or_silent_death():
    views = {0: RankView(0, pid=1, status={"status": "ok"}), 1: RankView(1, pid=2), 2: RankView(2)}
    assert failed_ranks(views) == []
    views[1].died_at = 1.0  # ended without a word
    assert failed_ranks(views) == [1]
    views[2].status = {"status": "timeout"}
    assert failed_ranks(views) == [1, 2]


# torchrun as it behaves with a stopped rank: its peer times out and exits 1, torchrun then sends
# SIGTERM (which a stopped process does not act on) and waits its grace before SIGKILL
FAKE_TORCHRUN = """
import json, os, signal, subprocess, sys, time
RANK = '''
import json, os, signal, sys, time
r, d = int(sys.argv[1]), os.environ["SHARDSIM_RUN_DIR"]
def put(name, data):
    with open(f"{d}/{name}.tmp", "w") as f:
        json.dump(data, f)
    os.replace(f"{d}/{name}.tmp", f"{d}/{name}")
put(f"rank{r}.start", {"rank": r, "pid": os.getpid(), "time": time.time()})
with open(f"{d}/rank{r}.step", "w") as f:
    f.write("2")
if r == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(0.5)
put(f"rank{r}.json", {"rank": r, "status": "timeout", "type": "RuntimeError", "step": 2,
                      "message": "Timed out waiting 1000ms for recv operation", "time": time.time()})
sys.exit(1)
'''
ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(r)], start_new_session=True) for r in range(2)]
time.sleep(20)
"""


def test_a_hung_rank_is_killed_as_soon_as_its_peer_names_it(monkeypatch, tmp_path):
    """docs/runtime.md: a hung rank ends the job within `--timeout` + 5 s (here a timeout of 1 s)."""
    script = tmp_path / "torchrun.py"
    script.write_text(FAKE_TORCHRUN)
    monkeypatch.setattr(launcher, "torchrun_command", lambda nproc, args, flags: [sys.executable, str(script)])
    t0 = time.monotonic()
    result = launcher.launch(2, [], timeout_s=1.0)
    wall = time.monotonic() - t0
    assert not result.ok
    assert result.message.startswith("rank 1 stopped responding at step 2: rank 0 timed out after 1 s"), result.message
    assert wall < 1.0 + HUNG_RANK_S, wall  # torchrun would have waited 20 s
    assert not any(alive(v.pid) for v in result.ranks.values() if v.pid)
    assert result.leftover_killed == []  # killed with torchrun, not left behind by it


def test_run_folders_of_launchers_that_are_gone_are_removed(monkeypatch, tmp_path):
    monkeypatch.setattr(launcher.tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    dead = ProcessRef.of(gone.pid) or ProcessRef(gone.pid, 0)
    gone.wait()
    me = ProcessRef.of(os.getpid())
    stale = tmp_path / f"shardsim-run-{dead.pid}.{dead.start}-x1"
    live = tmp_path / f"shardsim-run-{me.pid}.{me.start}-x2"
    other = tmp_path / "shardsim-run-abc"  # not named for its launcher: left alone
    for d in (stale, live, other):
        (d / "torchrun").mkdir(parents=True)
    assert launcher.remove_stale_run_dirs() == [stale]
    assert not stale.exists() and live.exists() and other.exists()
    assert f"--log-dir={live / 'torchrun'}" in launcher.torchrun_flags(live)  # not /tmp/torchelastic_*


COMMAND = """
import os, signal, sys, time
from shardsim.cli import app as cli
from shardsim.cli import run as run_cli
def command(ns):  # `shardsim run`, as it waits for its ranks
    os.kill(os.getpid(), signal.{sig})
    time.sleep(30)
run_cli.main_run = command
sys.exit(cli.main(["run"]))
"""


@pytest.mark.parametrize(
    ("sig", "status", "line"),
    [
        ("SIGINT", 130, "interrupted"),
        ("SIGTERM", 143, "terminated"),
        ("SIGHUP", 129, "terminated (SIGHUP)"),
        ("SIGQUIT", 131, "terminated (SIGQUIT)"),
    ],
)
def test_a_signal_ends_a_command_with_one_line_and_its_status(sig, status, line):
    proc = subprocess.run(
        [sys.executable, "-c", COMMAND.replace("{sig}", sig)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stderr) == (status, f"shardsim: {line}\n")


def test_sigterm_inside_an_emulated_cluster_is_termination():
    """`emulated` turns every signal that ends a command into an exception (it tears the cluster
    down on each); the command still exits 143 for SIGTERM, 129 and 131 for SIGHUP and SIGQUIT."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        with pytest.raises(Terminated) as term:
            namespaces._raise_interrupt(sig, None)
        assert exit_status(term.value) == 128 + sig
    with pytest.raises(KeyboardInterrupt) as info:
        namespaces._raise_interrupt(signal.SIGINT, None)
    assert not isinstance(info.value, Terminated) and exit_status(info.value) == 130


# `shardsim run` in an emulated cluster (brought up and down by stand-ins that say so) as a signal comes
EMULATED = """
import os, signal, sys, time
from shardsim.cli import app as cli
from shardsim.cli import run as run_cli
from shardsim.runtime.emulation import namespaces
namespaces.up = lambda cluster: print("up", flush=True)
namespaces.down = lambda cluster: print("down", flush=True)
def command(ns):
    with namespaces._up_for_block(None):
        os.kill(os.getpid(), signal.{sig})
        time.sleep(30)
run_cli.main_run = command
sys.exit(cli.main(["run"]))
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"])
def test_every_signal_that_ends_a_command_tears_its_emulated_cluster_down(sig):
    proc = subprocess.run(
        [sys.executable, "-c", EMULATED.replace("{sig}", sig)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout == "up\ndown\n", proc.stderr
    assert proc.returncode == 128 + signal.Signals[sig] and len(proc.stderr.splitlines()) == 1, proc.stderr


# a profile's forked workers, as the profile waits for them, when its process group is signalled
PROFILE_WORKERS = """
import multiprocessing as mp, sys, time
from shardsim.cli import app as cli
from shardsim.cli import run as run_cli
from shardsim.runtime.profile import cores
def command(ns):
    with cores._workers(mp.get_context("fork"), time.sleep, (60,), 3) as procs:
        time.sleep(0.5)  # the workers set their signals up
        print(" ".join(str(p.pid) for p in procs), flush=True)
        time.sleep(60)
run_cli.main_run = command
sys.exit(cli.main(["run"]))
"""


@pytest.mark.parametrize(("sig", "line"), [("SIGTERM", "terminated"), ("SIGHUP", "terminated (SIGHUP)")])
def test_a_signal_to_a_profiles_process_group_is_one_line_not_its_workers_tracebacks(sig, line):
    proc = subprocess.Popen(
        [sys.executable, "-c", PROFILE_WORKERS],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job
    )
    try:
        workers = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(workers) == 3
        os.killpg(proc.pid, signal.Signals[sig])
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (proc.returncode, err) == (128 + signal.Signals[sig], f"shardsim: {line}\n")
    assert gone_within(workers, 5)
