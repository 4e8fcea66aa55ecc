"""What each rank tells the launcher, through small files in the run folder.

`shardsim run` sets ``SHARDSIM_RUN_DIR``; each rank writes ``rank<r>.start`` (pid and start time), keeps
``rank<r>.step`` current (one pwrite of a few bytes per step) and, when it ends, writes
``rank<r>.json`` (ok, or the error). Without the variable (plain torchrun, Slurm) nothing is
written. When a job fails, the launcher names the rank that crashed, died or hung from these.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from shardsim.core.files import atomic_write
from shardsim.runtime.processes import ProcessRef

TIMEOUT_MARKERS = ("timed out", "timeout", "deadline")
PEER_MARKERS = ("connection closed", "connection reset", "broken pipe", "closed by peer", "peer", "socket closed")


def classify(message: str) -> str:
    """timeout (this rank waited too long for a peer) | peer (a peer went away) | error."""
    low = message.lower()
    if any(m in low for m in TIMEOUT_MARKERS):
        return "timeout"
    if any(m in low for m in PEER_MARKERS):
        return "peer"
    return "error"


def describe(exc: BaseException) -> tuple[str, str]:
    """The type and the one-line message a failure is reported by. An exception raised from
    another (``raise ... from``) is reported by its innermost cause, with the wrapper after it:
    a wrapper's own text may not say what failed (pipelining's "Failed to run stage backward"
    lists the stage's tensors and keeps the error in its cause)."""

    def line(e: BaseException) -> str:
        return " ".join(str(e).split()) or type(e).__name__

    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    if root is exc:
        return type(exc).__name__, line(exc)
    return type(root).__name__, f"{line(root)} (raised inside {type(exc).__name__}: {line(exc)})"


def _write_json(path: Path, data: dict) -> None:
    atomic_write(path, json.dumps(data), durable=False)  # read by the launcher while the job runs


class RankStatus:
    def __init__(self, run_dir: str | None, rank: int):
        self.rank = rank
        self.dir = Path(run_dir) if run_dir else None
        self.step_no = -1
        self.failure: BaseException | None = None  # reported: `finished` then leaves the report as it is
        self._fd = None
        if self.dir is not None:
            me = ProcessRef.of(os.getpid())
            start = {"rank": rank, "pid": os.getpid(), "start": me.start if me else None, "time": time.time()}
            _write_json(self.dir / f"rank{rank}.start", start)
            self._fd = os.open(self.dir / f"rank{rank}.step", os.O_WRONLY | os.O_CREAT, 0o644)

    def step(self, i: int) -> None:
        self.step_no = i
        if self._fd is not None:
            os.pwrite(self._fd, b"%-12d" % i, 0)

    def finished(self) -> None:
        if self.dir is not None and self.failure is None:
            _write_json(self.dir / f"rank{self.rank}.json", {"rank": self.rank, "status": "ok", "time": time.time()})

    def failed(self, exc: BaseException) -> None:
        self.failure = exc
        if self.dir is None:
            return
        kind, msg = describe(exc)
        data = {
            "rank": self.rank,
            "status": classify(msg),
            "type": kind,
            "message": msg[:500],
            "step": self.step_no,
            "time": time.time(),
        }
        try:
            _write_json(self.dir / f"rank{self.rank}.json", data)
        except OSError:
            pass
