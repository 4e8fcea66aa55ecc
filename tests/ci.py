"""The README's test command: the tests marked `serial` (they start ranks and clusters, or hold
the machine to a wall-clock promise) at the normal scheduling class, and beside them, at the
idle class (SCHED_IDLE: a task of it runs only on a core no other task wants, and gives the
core up as soon as one does; their session's autogroup at nice 19), the in-process tests on
every core (pytest-xdist) and then the regeneration check (`experiments/check_regenerated.py`).
The serial tests keep the cores they use; the others fill the time those tests wait (ranks
blocked on a shaped link, timeouts, sleeps, processes starting one at a time).

    python -m tests.ci         # from the repository's root; exit 0 when all three pass

The serial tests' output streams as it comes; the other two are printed when they end, after
it, each with its wall time. Ctrl-C ends all three."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERIAL = ["-m", "pytest", "-q", "-m", "serial"]
BESIDE = {  # run one after the other at the idle class, while SERIAL runs
    "in-process tests": ["-m", "pytest", "-q", "-n", "auto", "-m", "not serial", "-p", "no:cacheprovider"],
    "regeneration check": ["experiments/check_regenerated.py"],
}


@dataclass
class Phase:
    name: str
    returncode: int | None = None
    seconds: float = 0.0
    log: str = ""


def _idle_class() -> None:
    """In the child, its session made: the idle class, and where the kernel groups each session's
    tasks (autogroup: `kernel.sched_autogroup_enabled`, which shares the cores between sessions
    whatever their tasks' classes) the session's group at nice 19 too."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write("19")
    except OSError:  # a kernel without autogroup: the class alone decides
        pass


def _beside(phases: list[Phase], folder: Path, procs: list[subprocess.Popen]) -> None:
    """Run each of BESIDE in turn at the idle class, its output to a file of `folder`."""
    for phase in phases:
        out = folder / f"{len(procs)}.log"
        t0 = time.monotonic()
        with open(out, "w") as f:
            proc = subprocess.Popen(
                [sys.executable, *BESIDE[phase.name]], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                preexec_fn=_idle_class, start_new_session=True,
            )  # fmt: skip
            procs.append(proc)
            phase.returncode = proc.wait()
        phase.seconds = time.monotonic() - t0
        phase.log = out.read_text(errors="replace")


def main() -> int:
    t0 = time.monotonic()
    serial = Phase("serial tests")
    beside = [Phase(name) for name in BESIDE]
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="shardsim-ci-") as tmp:
        worker = threading.Thread(target=_beside, args=(beside, Path(tmp), procs), daemon=True)
        worker.start()
        try:
            serial.returncode = subprocess.call([sys.executable, *SERIAL], cwd=ROOT)
            serial.seconds = time.monotonic() - t0
            worker.join()
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    for phase in beside:
        print(f"\n--- {phase.name}: exit {phase.returncode}, {phase.seconds:.0f} s (beside the serial tests) ---")
        print(phase.log, end="")
    phases = [serial, *beside]
    print(f"\n--- {', '.join(f'{p.name} {p.seconds:.0f} s (exit {p.returncode})' for p in phases)}; "
          f"{time.monotonic() - t0:.0f} s in all ---")  # fmt: skip
    return 0 if all(p.returncode == 0 for p in phases) else 1


if __name__ == "__main__":
    sys.exit(main())
