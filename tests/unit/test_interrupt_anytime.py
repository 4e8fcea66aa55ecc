"""A signal at any moment of a command, start-up included, ends it: exit status 128 + the
signal's number within 2 s, no traceback, no process of its tree left, and stdout read to its
end (no worker holds it open: `| tee` ends). Hypothesis draws the moments.

The clock starts once the program handles signals itself (SIGTERM caught, read from
/proc/PID/status): before that the interpreter is loading its `site` module, where a signal is
Python's own to report.

How many trials: each costs a start of the command (the run's: torchrun and two ranks importing
torch) and up to 8 s of waiting, so each command gets `MOMENTS`, fixed ones at the edges of its
phases (the instant it handles signals, inside start-up: space enumerated, torchrun starting;
the phase boundary at 3 s; once the sweep's workers or the run's ranks work: 5 s), plus
`DRAWN` moments hypothesis draws between those edges (derandomized: the same ones every time);
a failure found at any of them is shrunk and replayed. Drawn moments are fixed instants like
the others, so more of them only fill the same strata more densely: 2 (7 trials a command).
Teardown is the signal's own: every trial checks that the command ends within the promise
while its tree is being torn down."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tests.unit.test_sweep_interrupt import CTRL_C_PROMISE_S

SHARDSIM = str(Path(sys.executable).with_name("shardsim"))
LARGE_SWEEP = (
    "sweep --workload llama-3.1-70b --topology p5.48xlarge,p4d.24xlarge --nodes 1,2,4,8,16 --exhaustive"
    " --no-cache -y --no-progress --precisions bf16,fp16 --checkpointing none,full,selective"
).split()
# steps enough that the run lasts past the last signal (its default 5 take about 5 s here)
RUN = "run --topology emu-2x2 --no-emulate --nproc 2 --workload tiny-gpt --steps 500".split()
DRAWN = 2  # moments hypothesis draws, beyond `MOMENTS`
EXAMPLES = settings(
    max_examples=DRAWN, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)
# half the signals in the first 3 s (start-up, the space enumerated), half once the workers or
# ranks run (on a loaded 2-core machine the sweep's pool starts 4-6 s in, the run's ranks 3-7 s)
DELAYS = st.floats(min_value=0.0, max_value=3.0) | st.floats(min_value=3.0, max_value=8.0)
MOMENTS = (0.0, 0.5, 1.5, 3.0, 5.0)  # tried every time, before the drawn ones

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)"),
]


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _tree(pid: int) -> set[int]:
    """The live processes below `pid`, from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.add(kid)
            todo.append(kid)
    return out


def _in_group(pgid: int) -> set[int]:
    """The live processes of process group `pgid`."""
    pids = (int(e) for e in os.listdir("/proc") if e.isdigit())
    return {p for p in pids if (f := _stat(p)) and f[0] != "Z" and f[3] == str(pgid)}


def _catches_sigterm(pid: int) -> bool:
    try:
        caught = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


def signal_after(argv: list[str], delay: float, sig: int = signal.SIGINT) -> dict:
    """Start `argv` in a session of its own, send `sig` to its process group `delay` s after it
    handles signals, and report how it ended: status, seconds from the signal to its exit and
    its pipes' end, stderr, and the processes of its tree (seen while it ran) or group left."""
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    try:
        ready = time.monotonic() + 30
        while not _catches_sigterm(proc.pid) and proc.poll() is None and time.monotonic() < ready:
            time.sleep(0.002)
        due = time.monotonic() + delay
        while time.monotonic() < due and proc.poll() is None:
            seen |= _tree(proc.pid)
            time.sleep(0.01)
        ended_first = proc.poll() is not None
        if not ended_first:
            os.killpg(proc.pid, sig)  # what a terminal's Ctrl-C does
        t0 = time.monotonic()
        try:
            _, err = proc.communicate(timeout=10)  # both pipes read to their end
        except subprocess.TimeoutExpired:
            err = "(no end of its pipes in 10 s)"
        took = time.monotonic() - t0
        time.sleep(0.05)  # a killed process is gone from /proc once reaped by its new parent
        left = {p for p in seen if _stat(p) and _stat(p)[0] != "Z"} | _in_group(proc.pid)
    finally:
        for pid in _tree(proc.pid) | _in_group(proc.pid):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return {
        "status": proc.returncode,
        "took": took,
        "err": err,
        "left": sorted(left),
        "seen": len(seen),
        "ended_first": ended_first,
    }


def _check(outcome: dict, status: int, line: str) -> None:
    assert not outcome["ended_first"], f"the command ended before the signal: {outcome}"
    assert outcome["status"] == status, outcome
    assert outcome["err"].endswith(f"shardsim: {line}\n") and "Traceback" not in outcome["err"], outcome
    assert not outcome["left"], f"processes outlived the command: {outcome}"
    assert outcome["took"] <= CTRL_C_PROMISE_S, f"exited {outcome['took']:.2f} s after the signal"


def _summary(name: str, outcomes: list[dict]) -> None:
    took = [o["took"] for o in outcomes]
    statuses = sorted({o["status"] for o in outcomes})
    print(
        f"{name}: {len(outcomes)} runs, statuses {statuses}, exit after the signal max {max(took):.3f} s,"
        f" median {statistics.median(took):.3f} s, processes left {sum(len(o['left']) for o in outcomes)},"
        f" {sum(o['seen'] >= 2 for o in outcomes)} while 2+ processes of its tree ran"
    )


def moments(test):
    """`test` tried at every one of `MOMENTS` first (explicit examples)."""
    for delay in reversed(MOMENTS):
        test = example(delay=delay)(test)
    return test


@pytest.mark.parametrize(("argv", "name"), [(LARGE_SWEEP, "sweep"), (RUN, "run")])
def test_ctrl_c_at_any_moment_ends_the_command_and_its_tree(argv, name) -> None:
    if name == "run":
        pytest.importorskip("torch")
    outcomes: list[dict] = []

    @EXAMPLES
    @given(delay=DELAYS)
    @moments
    def ctrl_c(delay: float) -> None:
        outcome = signal_after([SHARDSIM, *argv], delay)
        assume(not outcome["ended_first"])  # done (or failed to start) before the signal: nothing to interrupt
        outcomes.append(outcome)
        _check(outcome, 130, "interrupted")

    ctrl_c()
    _summary(f"Ctrl-C into {name}", outcomes)
    assert max(o["seen"] for o in outcomes) >= 2, "no signal reached the command while its workers ran"


@pytest.mark.parametrize("delay", [0.0, 0.4, 1.5, 2.8])
def test_sigterm_at_any_moment_ends_the_sweep_143(delay) -> None:
    _check(signal_after([SHARDSIM, *LARGE_SWEEP], delay, signal.SIGTERM), 143, "terminated")
