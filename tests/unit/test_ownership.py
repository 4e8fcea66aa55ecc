"""One job at a time per emulated topology (runtime/emulation/ownership.py), and locks that leave no
file behind (runtime/lockfile.py), with real processes but no network namespaces: a topology's
"cluster exists" is a file here."""

from __future__ import annotations

import csv
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shardsim.core import lockfile
from shardsim.runtime.emulation.ownership import TopologyBusy, holder_of, owning, runtime_dir
from shardsim.runtime.records import CSV_NAME, write_run
from tests.helpers import run_record

ROOT = Path(__file__).resolve().parents[2]
NAME = "ss-emu-test"

# holds NAME as `owning` does for a job; argv: mode (hold, keep, wait), the file that stands for the cluster
_HOLDER = textwrap.dedent(
    """
    import os, sys
    from shardsim.runtime.emulation.ownership import keep, owning
    mode, cluster = sys.argv[1], sys.argv[2]
    with owning("ss-emu-test", wait="wait" in mode, present=lambda: os.path.exists(cluster)):
        print("held", flush=True)
        if "keep" in mode:
            keep("ss-emu-test")
        if "hold" in mode:
            sys.stdin.readline()  # until the test says
    print("released", flush=True)
    """
)


@pytest.fixture
def rundir(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    monkeypatch.setenv("SHARDSIM_RUNTIME_DIR", str(folder))
    assert runtime_dir() == folder
    return folder


def _holder(mode: str, cluster: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _HOLDER, mode, str(cluster)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _line(proc: subprocess.Popen, within_s: float) -> str | None:
    """The next line `proc` prints, or None if it prints none within `within_s`."""
    ready, _, _ = select.select([proc.stdout], [], [], within_s)
    return proc.stdout.readline().strip() if ready else None


def test_a_second_job_is_refused_with_one_line_naming_the_holder(rundir, tmp_path):
    a = _holder("hold", tmp_path / "cluster")
    try:
        assert _line(a, 60) == "held"
        with pytest.raises(TopologyBusy) as err:
            with owning(NAME, label="emu-test"):
                pass
        text = str(err.value)
        assert "\n" not in text and text.startswith("emu-test is in use by ")
        assert f"pid {a.pid} (" in text and "hold" in text and f"since {time.strftime('%Y-%m-%d')}" in text
        assert "--wait" in text
        assert err.value.holder.pid == a.pid
        a.stdin.write("\n")
        a.stdin.flush()
        assert _line(a, 60) == "released"
    finally:
        a.kill()
        a.wait()
    with owning(NAME):  # free again
        assert holder_of(NAME).pid == os.getpid()
    assert os.listdir(rundir) == []  # no lock file, no record


def test_wait_waits_for_the_holder_then_holds(rundir, tmp_path):
    a = _holder("hold", tmp_path / "cluster")
    b = None
    try:
        assert _line(a, 60) == "held"
        b = _holder("wait", tmp_path / "cluster")
        assert _line(b, 3) is None  # a holds until told: b cannot have it
        a.stdin.write("\n")
        a.stdin.flush()
        assert _line(a, 60) == "released"
        assert _line(b, 60) == "held"
        assert _line(b, 60) == "released"
        assert b.wait(timeout=60) == 0
    finally:
        for p in (a, b):
            if p is not None:
                p.kill()
                p.wait()
    assert os.listdir(rundir) == []


def test_a_kept_hold_outlives_its_process_while_its_cluster_exists(rundir, tmp_path):
    cluster = tmp_path / "cluster"
    cluster.touch()
    exists = cluster.exists
    up = _holder("keep", cluster)  # as `shardsim cluster up`
    assert up.communicate(timeout=60)[0].split() == ["held", "released"]
    assert os.listdir(rundir) == [f"{NAME}.json"]  # the record only
    with pytest.raises(TopologyBusy, match=r"up by hand, held by pid \d+ .* until `shardsim cluster down emu`"):
        with owning(NAME, label="emu", present=exists):
            pass
    with owning(NAME, present=exists, take_kept=True):  # as `cluster down`, which fails to take it down
        assert holder_of(NAME).pid == os.getpid()
    assert holder_of(NAME).pid == up.pid and holder_of(NAME).kept  # still held by the cluster that is up
    stale = []
    cluster.unlink()  # gone by other means than `cluster down`
    with owning(NAME, present=exists, clean=stale.append):
        pass
    assert [h.pid for h in stale] == [up.pid]
    assert os.listdir(rundir) == []


def test_cluster_down_releases_a_kept_hold(rundir, tmp_path):
    cluster = tmp_path / "cluster"
    cluster.touch()
    assert _holder("keep", cluster).communicate(timeout=60)[0].split() == ["held", "released"]
    with owning(NAME, present=cluster.exists, take_kept=True):
        cluster.unlink()  # taken down
    assert os.listdir(rundir) == []
    with owning(NAME, present=cluster.exists):
        pass


def test_a_killed_holder_is_stale_and_cleaned(rundir, tmp_path):
    a = _holder("hold", tmp_path / "cluster")
    try:
        assert _line(a, 60) == "held"
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)
    finally:
        a.kill()
    assert sorted(os.listdir(rundir)) == [f"{NAME}.json", f"{NAME}.lock"]  # what a killed holder leaves
    stale = []
    with owning(NAME, clean=stale.append) as me:
        assert me.pid == os.getpid()
    assert [h.pid for h in stale] == [a.pid]
    assert os.listdir(rundir) == []


def test_a_hold_is_reentrant_within_a_process(rundir):
    with owning(NAME) as outer:
        with owning(NAME, wait=False) as inner:
            assert inner == outer
        assert holder_of(NAME) == outer  # the inner block let go of nothing
    assert os.listdir(rundir) == []


_COUNTER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from shardsim.core.lockfile import locked
    counter = Path(sys.argv[1])
    for _ in range(int(sys.argv[2])):
        with locked(str(counter) + ".lock"):
            counter.write_text(str(int(counter.read_text()) + 1))
    """
)


def test_the_lock_file_excludes_and_is_gone_when_free(tmp_path):
    counter = tmp_path / "n"
    counter.write_text("0")
    procs = [subprocess.Popen([sys.executable, "-c", _COUNTER, str(counter), "300"], cwd=ROOT) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert counter.read_text() == "1200"  # no increment lost: one holder at a time
    assert os.listdir(tmp_path) == ["n"]
    fd = lockfile.acquire(tmp_path / "x.lock")
    assert lockfile.acquire(tmp_path / "x.lock", blocking=False) is None
    lockfile.release(tmp_path / "x.lock", fd)
    assert os.listdir(tmp_path) == ["n"]


_WRITER = textwrap.dedent(
    """
    import sys
    from shardsim.runtime.records import write_run
    from tests.helpers import run_record
    for i in range(int(sys.argv[3])):
        write_run(run_record(run_id=f"{sys.argv[2]}-{i}"), sys.argv[1])
    """
)


def test_runs_csv_keeps_every_row_and_leaves_no_lock_file(tmp_path):
    out = tmp_path / "runs"
    write_run(run_record(run_id="first"), out)
    assert sorted(os.listdir(out)) == ["first.json", CSV_NAME]
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(out), f"w{w}", "10"], cwd=ROOT) for w in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 3
    rows = [r["run_id"] for r in csv.DictReader(open(out / CSV_NAME))]
    assert len(rows) == 31 and len(set(rows)) == 31
    assert not [name for name in os.listdir(out) if name.startswith(".")]


def test_a_refused_run_makes_nothing_and_says_one_line(rundir, tmp_path):
    """`run` on a busy topology is refused before its --out folder is made or its plan is printed."""
    from shardsim.runtime.emulation.plan import plan_cluster

    prefix = plan_cluster("emu-2x2").prefix
    out = tmp_path / "results"
    env = dict(os.environ, SHARDSIM_RUNTIME_DIR=str(rundir))
    with owning(prefix, present=lambda: False):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "shardsim.cli",
                "run",
                "--topology",
                "emu-2x2",
                "--workload",
                "tiny-gpt",
                "--out",
                str(out),
            ],  # fmt: skip
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "in use" in lines[0], r.stderr
    assert not out.exists()
