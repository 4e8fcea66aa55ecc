"""An emulated topology is owned by one job at a time (runtime/emulation/ownership.py), for real:
a second job is refused with one line naming the holder or waits with --wait, the first
completes unharmed; a cluster up by hand is held until `cluster down`; teardown kills only what
shardsim started; a killed holder's leftovers are cleaned with a note; nothing is left behind
(lock files, torchelastic folders). Needs root and iproute2.

Every test uses a topology of its own name (a copy of emu-2x2), so a cluster someone has up on
this machine is never touched, and a runtime dir of its own (SHARDSIM_RUNTIME_DIR)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shardsim.runtime.emulation.iproute import existing_namespaces
from shardsim.runtime.processes import alive
from tests.root_only import needs_root

ROOT = Path(__file__).resolve().parents[2]

pytestmark = needs_root


class Setup:
    def __init__(self, tmp_path: Path):
        self.name = f"emu-o{os.getpid()}"
        self.prefix = f"ss-{self.name}"
        self.topology = tmp_path / f"{self.name}.yaml"
        text = (ROOT / "shardsim" / "data" / "topologies" / "emu-2x2.yaml").read_text()
        self.topology.write_text(text.replace("name: emu-2x2", f"name: {self.name}", 1))
        self.rundir = tmp_path / "run"
        self.tmp = tmp_path / "tmp"  # TMPDIR of every command: what they leave there is seen
        self.tmp.mkdir()
        self.env = {**os.environ, "SHARDSIM_RUNTIME_DIR": str(self.rundir), "TMPDIR": str(self.tmp)}
        self.tmp_path = tmp_path

    def namespaces(self) -> set[str]:
        return {ns for ns in existing_namespaces() if ns.startswith(self.prefix + "-")}

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "shardsim.cli", *args]

    def shardsim(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)

    def start_run(self, out: str, *extra: str, steps: int = 3) -> subprocess.Popen:
        argv = self.argv("run", "--topology", str(self.topology), "--workload", "tiny-mlp", "--steps", str(steps),
                         "--warmup", "1", "--out", str(self.tmp_path / out), *extra)  # fmt: skip
        log = open(self.tmp_path / f"{out}.log", "w")
        return subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True)

    def log(self, out: str) -> str:
        return (self.tmp_path / f"{out}.log").read_text()

    def cleanup(self) -> None:
        subprocess.run(self.argv("cluster", "down", str(self.topology), "--kill"), cwd=ROOT, env=self.env,
                       capture_output=True, timeout=120)  # fmt: skip


@pytest.fixture
def setup(tmp_path):
    s = Setup(tmp_path)
    yield s
    s.cleanup()  # whatever a failing test left


def _error_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a refused command prints (after its info lines), checked to be the only error."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("shardsim: error: ")]
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr
    return errors[0]


def _wait_for(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.2)


def _holds(setup: Setup) -> bool:
    """The run holds the topology and its cluster is up (its record written, namespaces made)."""
    return (setup.rundir / f"{setup.prefix}.json").exists() and len(setup.namespaces()) == 3


def test_a_second_job_is_refused_or_waits_and_the_first_completes(setup):
    a = setup.start_run("a", steps=60)
    c = None
    try:
        _wait_for(lambda: _holds(setup) or a.poll() is not None, 120, "run a holds the topology")
        assert a.poll() is None, setup.log("a")
        holder = rf"{setup.name} is in use by pid {a.pid} \(shardsim run --topology {setup.topology} .*\) since \S+ \S+"

        t0 = time.monotonic()
        b = setup.shardsim("run", "--topology", str(setup.topology), "--workload", "tiny-mlp", "--out",
                           str(setup.tmp_path / "b"))  # fmt: skip
        refused_s = time.monotonic() - t0
        assert re.fullmatch(rf"shardsim: error: {holder}; pass --wait to wait for it", _error_line(b))
        for action in ("up", "down"):  # `cluster up` during a run would tear it down; `down` would kill it
            assert re.search(holder, _error_line(setup.shardsim("cluster", action, str(setup.topology))))
        c = setup.start_run("c", "--wait")
        _wait_for(lambda: "waiting (--wait)" in setup.log("c") or c.poll() is not None, 60, "run c waits")
        assert c.poll() is None and re.search(rf"{holder}; waiting \(--wait\)", setup.log("c")), setup.log("c")
        assert a.poll() is None, "a must still be running: it held the topology throughout"

        assert a.wait(timeout=300) == 0, setup.log("a")  # unharmed
        assert c.wait(timeout=300) == 0, setup.log("c")  # then ran
    finally:
        for p in (a, c):
            if p is not None and p.poll() is None:
                p.kill()
    print(f"a second run refused in {refused_s:.1f} s")
    for out in ("a", "c"):
        names = os.listdir(setup.tmp_path / out)
        assert sorted(n for n in names if not n.endswith(".json")) == ["runs.csv"], names  # no .runs.csv.lock
    assert not (setup.tmp_path / "b").exists() or os.listdir(setup.tmp_path / "b") == []
    assert os.listdir(setup.rundir) == []  # no lock file, no record
    assert os.listdir(setup.tmp) == []  # no torchelastic_* folder, no shardsim-run-*
    assert not setup.namespaces()


def test_a_cluster_up_by_hand_is_held_until_down_and_its_processes_are_never_killed_unasked(setup):
    topo = str(setup.topology)
    up = setup.shardsim("cluster", "up", topo)
    assert up.returncode == 0, up.stderr
    assert os.listdir(setup.rundir) == [f"{setup.prefix}.json"]  # the record holds it; no lock file
    mine = subprocess.Popen(["ip", "netns", "exec", f"{setup.prefix}-n1", "sleep", "300"])  # the user's process
    try:
        time.sleep(0.2)
        held = (
            rf"{setup.name} is up by hand, held by pid \d+ \(shardsim cluster up {re.escape(topo)}\) since \S+ \S+ "
            rf"until `shardsim cluster down {re.escape(topo)}`"  # a file topology goes down by its path
        )
        run = setup.shardsim("run", "--topology", topo, "--workload", "tiny-mlp", "--out", str(setup.tmp_path / "r"))
        assert re.fullmatch(rf"shardsim: error: {held}; pass --wait to wait for that", _error_line(run))
        assert re.search(held, _error_line(setup.shardsim("cluster", "up", topo)))
        profile = setup.shardsim("profile", "--topology", topo, "--workload", "tiny-mlp", "--out",
                                 str(setup.tmp_path / "p.json"))  # fmt: skip
        assert re.search(held, _error_line(profile))
        matrix = setup.tmp_path / "matrix.yaml"
        matrix.write_text(f"workload: tiny-mlp\ntopologies:\n  {topo}: [ddp]\n")
        validate = setup.shardsim("validate", "--matrix", str(matrix), "--out", str(setup.tmp_path / "v"))
        assert re.search(held, _error_line(validate))
        assert mine.poll() is None and len(setup.namespaces()) == 3  # untouched

        st = setup.shardsim("cluster", "status", topo)
        assert st.returncode == 0 and re.search(held.replace(f"{setup.name} is ", ""), st.stdout), st.stdout

        down = setup.shardsim("cluster", "down", topo)
        line = _error_line(down)
        assert f"still runs pid {mine.pid} (sleep 300) in {setup.prefix}-n1, which shardsim did not start" in line
        assert "--kill" in line
        assert mine.poll() is None and len(setup.namespaces()) == 3
        again = setup.shardsim("run", "--topology", topo, "--workload", "tiny-mlp", "--out", str(setup.tmp_path / "r"))
        assert re.search(held, _error_line(again))  # down refused: still held

        down = setup.shardsim("cluster", "down", topo, "--kill")
        assert down.returncode == 0 and "3 namespaces removed" in down.stdout, down.stderr
        assert f"killed pid {mine.pid} (sleep 300)" in down.stderr
        assert mine.wait(timeout=10) is not None
    finally:
        mine.kill()
    assert not setup.namespaces() and os.listdir(setup.rundir) == []


_KILLED_HOLDER = textwrap.dedent(
    """
    import subprocess, sys, time
    from shardsim.runtime.emulation.namespaces import emulated
    from shardsim.runtime.emulation.plan import plan_cluster
    from shardsim.runtime.emulation.processes import run_in_node
    with emulated(plan_cluster(sys.argv[1])) as c:
        run_in_node(c, 1, ["sleep", "300"])  # what a killed job leaves running: a rank, say
        print("up", flush=True)
        time.sleep(300)
    """
)


def _pids_of(setup: Setup, argv0: str) -> list[int]:
    out = []
    for ns in setup.namespaces():
        res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in res.stdout.split():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == argv0:
                    out.append(int(pid))
            except OSError:
                pass  # ended meanwhile
    return out


def test_a_killed_holders_leftovers_are_cleaned_with_a_note_and_a_stranger_is_left_alone(setup):
    holder = subprocess.Popen([sys.executable, "-c", _KILLED_HOLDER, str(setup.topology)], cwd=ROOT,
                              env=setup.env, stdout=subprocess.PIPE, text=True)  # fmt: skip
    stranger = None
    try:
        assert holder.stdout.readline().strip() == "up"
        _wait_for(lambda: _pids_of(setup, "sleep"), 10, "the holder's sleeper runs")
        (left,) = _pids_of(setup, "sleep")
        stranger = subprocess.Popen(["ip", "netns", "exec", f"{setup.prefix}-n0", "sleep", "301"])
        _wait_for(lambda: len(_pids_of(setup, "sleep")) == 2, 10, "the stranger runs")
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        assert len(setup.namespaces()) == 3  # left behind

        up = setup.shardsim("cluster", "up", str(setup.topology))
        assert up.returncode == 0, up.stderr
        notes = [line for line in up.stderr.splitlines() if line.startswith("shardsim: ")]
        assert len(notes) == 2, up.stderr
        assert re.fullmatch(
            rf"shardsim: {setup.name}: pid {holder.pid} \(-c {re.escape(str(setup.topology))}\) since \S+ \S+ "
            r"ended without taking its cluster down; removed its 3 namespaces",
            notes[1],
        ), up.stderr
        assert (
            f"left running pid {stranger.pid} (sleep 301) in {setup.prefix}-n0, which shardsim did not start"
            in (notes[0])
        )
        _wait_for(lambda: not alive(left), 10, "the killed holder's sleeper is killed")
        assert stranger.poll() is None  # not ours: alive
        assert json.loads((setup.rundir / f"{setup.prefix}.json").read_text())["kept"] is True
    finally:
        holder.kill()
        if stranger is not None:
            stranger.kill()
    down = setup.shardsim("cluster", "down", str(setup.topology))
    assert down.returncode == 0, down.stderr
    assert os.listdir(setup.rundir) == [] and not setup.namespaces()


@pytest.mark.parametrize(("sig", "line"), [("SIGHUP", "terminated (SIGHUP)"), ("SIGQUIT", "terminated (SIGQUIT)")])
def test_a_hangup_or_quit_ends_an_emulated_run_and_leaves_nothing_for_the_next_job(setup, sig, line):
    """The terminal closed (SIGHUP) or Ctrl-\\ (SIGQUIT): as SIGTERM, the run tears its cluster
    down and lets go of the topology before it exits, not the next job."""
    run = setup.start_run("a", steps=200)
    try:
        _wait_for(lambda: _holds(setup), 120, "the run holds its cluster")
        run.send_signal(signal.Signals[sig])
        assert run.wait(timeout=30) == 128 + signal.Signals[sig], setup.log("a")
    finally:
        if run.poll() is None:
            run.kill()
    assert setup.log("a").rstrip().endswith(f"shardsim: {line}"), setup.log("a")
    assert "Traceback" not in setup.log("a")
    assert not setup.namespaces() and not (setup.rundir / f"{setup.prefix}.json").exists()
