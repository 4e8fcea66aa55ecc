"""Processes, read from /proc (Linux): whether one still runs, which process a pid names, a
process tree, ending that tree at once, tying a child's life to its parent's, and ending this
process without finalizing the interpreter."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

PR_SET_PDEATHSIG = 1  # prctl(2)
LAUNCHER_ENV = "SHARDSIM_LAUNCHER"  # "pid:start" of the shardsim process that started a job


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state is [0], ppid [1], start time [19])."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """True while `pid` runs: a zombie (exited, not yet reaped by its parent) counts as gone."""
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


@dataclass(frozen=True)
class ProcessRef:
    """One process, told apart from a later one that reuses its pid by its start time (clock
    ticks after boot). Written ``pid:start`` (`str`, `parse`)."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        fields = _stat(pid)
        return cls(pid, int(fields[19])) if fields else None

    @classmethod
    def parse(cls, text: str | None) -> ProcessRef | None:
        pid, _, start = (text or "").partition(":")
        try:
            return cls(int(pid), int(start))
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"{self.pid}:{self.start}"

    def alive(self) -> bool:
        fields = _stat(self.pid)
        return bool(fields) and fields[0] not in ("Z", "X") and int(fields[19]) == self.start

    def kill(self, sig: int = signal.SIGKILL) -> bool:
        """Send `sig` to this process, never to a later one with its pid (through a pidfd taken
        while it was still this one). False when it is gone."""
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:
            return False
        try:
            if not self.alive():
                return False
            signal.pidfd_send_signal(fd, sig)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, theirs, ...), from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and fields[0] not in ("Z", "X"):
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tree(pid: int, others: tuple[ProcessRef, ...] = ()) -> None:
    """SIGKILL `pid`, every process below it and `others`, at once and quietly (no process gets
    a signal it could log or clean up on). `pid` is stopped first: it neither starts a process
    nor reports the end of one meanwhile, and holds the pids of children that end (zombies it
    cannot reap), so that no pid signalled here can name another process yet."""
    _signal(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline and (_stat(pid) or ["X"])[0] not in ("T", "t", "Z", "X"):
        time.sleep(0.005)
    for p in descendants(pid):
        _signal(p, signal.SIGKILL)
    for ref in others:
        ref.kill()
    _signal(pid, signal.SIGKILL)


def _prctl():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # looked up here, not in a child between fork and exec


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send `sig` to this process when its parent (the thread that started it)
    ends (``prctl(PR_SET_PDEATHSIG)``; kept across exec). Safe as a ``preexec_fn``. False where
    the call is not available."""
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def launcher() -> ProcessRef | None:
    """The shardsim process that started this job (``$SHARDSIM_LAUNCHER``), None outside one."""
    return ProcessRef.parse(os.environ.get(LAUNCHER_ENV))


def end_with(
    parent: ProcessRef, interval_s: float = 0.5, cleanup: Callable[[], None] | None = None
) -> threading.Thread:
    """Watch `parent` from a daemon thread and SIGKILL this process (quietly: nothing is written,
    no result reported) once it is gone, after `cleanup`. For processes whose parent-death
    signal cannot name `parent` (it is not their parent: torchrun's ranks)."""

    def watch() -> None:
        while parent.alive():
            time.sleep(interval_s)
        try:
            if cleanup is not None:
                cleanup()
        finally:
            os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="shardsim-launcher-watch", daemon=True)
    thread.start()
    return thread


def follow_launcher(cleanup: Callable[[], None] | None = None) -> None:
    """In a process a shardsim job started under torchrun (``$SHARDSIM_LAUNCHER`` set): SIGKILL
    it when torchrun, its parent, dies, and when the launcher is gone (`end_with`; `cleanup`
    first). Nothing changes without the variable (plain torchrun, Slurm)."""
    parent = launcher()
    if parent is None:
        return
    die_with_parent()
    end_with(parent, cleanup=cleanup)


def exit_now(code: int) -> NoReturn:
    """End this process with `code` once its output is flushed, without finalizing the interpreter.

    For a process whose native threads may still call into Python as it ends: a gloo process
    group outlives ``destroy_process_group()`` while anything holds it (FSDP2's device mesh,
    which torch keeps), and its worker threads, as they let go of the last collective, release
    tensors that need the GIL. Taking the GIL while the interpreter finalizes ends a thread with
    ``pthread_exit``, whose unwinding through C++ calls ``std::terminate`` ("terminate called
    without an active exception"): the process aborts. ``os._exit`` skips finalization (and
    ``atexit`` handlers); the kernel ends every thread at once."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken pipe: nothing more can be said
            stream.flush()
    os._exit(code)
