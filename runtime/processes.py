"""Whether a process still runs, read from /proc (Linux)."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """True while `pid` runs: a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
