"""How a signal ends a shardsim command: SIGINT raises KeyboardInterrupt; SIGTERM, SIGHUP and
SIGQUIT raise `Terminated`, a KeyboardInterrupt too, so that every cleanup written for Ctrl-C
runs for each of them; the CLI turns any of them into one line and exit status 128 + the
signal's number (130, 143, 129, 131), as a shell reports a process the signal ended.

The first signal is also recorded (`received`): a KeyboardInterrupt that some code swallows or
turns into another error (one raised inside a finalizer, or inside a library's callback) still
ends the command with the signal's status, and a command that has not stopped `GRACE_S` after
the signal is ended by the `raising` block's `deadline` (its processes killed, one line)."""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

# the signals that end a command (each raises inside it, so that what it started is stopped)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
STATUSES = frozenset(128 + s for s in SIGNALS)  # the exit statuses they give
GRACE_S = 1.2  # after the first signal: how long a command has to stop itself before `deadline` ends it
RAISE_AGAIN_S = 0.01  # after an interrupt raised where it could not propagate: when it is raised again
PR_SET_PDEATHSIG = 1  # prctl(2)
PR_SET_CHILD_SUBREAPER = 36

_received: list[int] = []  # the first signal that arrived, if any
_guarded: list[str] = []  # the `guarded` blocks that run: a signal's deadline waits for them
_wake: list[int] = []  # while a `raising` block runs: the pipe its watcher (`_watch`) reads

FIRST, AGAIN, DONE = b"s", b"r", b"q"  # what the watcher is told: the first signal came; raise it again; stop
os.register_at_fork(after_in_child=_wake.clear)  # a forked process's signals are not this one's to watch


class Terminated(KeyboardInterrupt):
    """SIGTERM, SIGHUP or SIGQUIT arrived (`signum`)."""

    def __init__(self, signum: int = signal.SIGTERM):
        self.signum = signal.Signals(signum)
        super().__init__(f"signal {self.signum.name}")

    def __reduce__(self):
        return type(self), (int(self.signum),)


def interrupt(signum: int) -> KeyboardInterrupt:
    """The exception a signal raises: KeyboardInterrupt for SIGINT, Terminated for any other."""
    return KeyboardInterrupt("signal SIGINT") if signum == signal.SIGINT else Terminated(signum)


def received() -> KeyboardInterrupt | None:
    """The interrupt of the first signal recorded (`record`, `raise_interrupt`), None before one."""
    return interrupt(_received[0]) if _received else None


def forget() -> None:
    """Forget the signal recorded (a command run in-process after another was interrupted)."""
    _received.clear()


def record(signum: int, frame=None) -> None:
    """A signal handler that records the signal and raises nothing (while the command loads:
    the command checks `received` before it starts). The first signal starts the deadline of
    the `raising` block that runs (its watcher is told through a pipe: no lock taken here)."""
    if _received:
        return
    _received.append(signum)
    _tell(FIRST)


def _tell(what: bytes) -> None:
    with contextlib.suppress(OSError, IndexError):
        os.write(_wake[0], what)


def raise_interrupt(signum: int, frame) -> None:
    """A signal handler: records the signal (`record`), then raises KeyboardInterrupt for SIGINT,
    Terminated for any other signal."""
    record(signum)
    raise interrupt(signum)


def _watch(wake: int, deadline: Callable[[int], None] | None, running: threading.Event) -> None:
    """A `raising` block's watcher thread, until the block ends (the pipe closed): raises an
    interrupt again in the main thread when asked (`_swallowed`), and on the first signal runs
    `deadline(signum)` once `GRACE_S` have passed, later while the main thread blocks the
    signals or a `guarded` block runs (a teardown that must finish: an emulated cluster's), never
    after the block."""
    while (what := os.read(wake, 1)) not in (b"", DONE):  # a forked process may hold the pipe open
        if what == AGAIN:
            time.sleep(RAISE_AGAIN_S)
            if running.is_set() and _received:
                _thread.interrupt_main(_received[0])
        elif deadline is not None:
            time.sleep(GRACE_S)
            while _main_blocks_signals() or _guarded:
                time.sleep(0.05)
            if running.is_set():
                deadline(_received[0])
    os.close(wake)


@contextlib.contextmanager
def guarded(what: str) -> Iterator[None]:
    """While the block runs, a signal's deadline (`raising`) waits: what it set up (an emulated
    cluster, its namespaces and shaped links) is torn down by its own cleanup, however long the
    ranks take to stop, rather than left behind by a kill."""
    _guarded.append(what)
    try:
        yield
    finally:
        _guarded.remove(what)


def _main_blocks_signals() -> bool:
    """Whether the main thread holds SIGINT blocked (Linux: /proc; False elsewhere)."""
    tid = threading.main_thread().native_id
    try:
        with open(f"/proc/self/task/{tid}/status") as f:
            blocked = next(line for line in f if line.startswith("SigBlk:"))
    except (OSError, StopIteration):
        return False
    return bool(int(blocked.split()[1], 16) >> (signal.SIGINT - 1) & 1)


def _swallowed(unraisable) -> None:
    """sys.unraisablehook: an interrupt raised where it cannot propagate (a finalizer, a
    ``__del__``) is raised again in the main thread, silently, once this hook has returned (from
    a thread: raised inside the hook it would be reported as the hook's); anything else as
    Python reports it."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received and _wake:
        _tell(AGAIN)
        return
    sys.__unraisablehook__(unraisable)


def exit_status(exc: KeyboardInterrupt) -> int:
    """128 + the number of the signal that raised `exc` (Ctrl-C's when it names none)."""
    return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)


def describe(exc: KeyboardInterrupt) -> str:
    """What a command that `exc` ended says: ``interrupted`` (Ctrl-C), ``terminated`` (SIGTERM),
    ``terminated (SIGHUP)``, ``terminated (SIGQUIT)``."""
    if not isinstance(exc, Terminated):
        return "interrupted"
    return "terminated" if exc.signum == signal.SIGTERM else f"terminated ({exc.signum.name})"


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def recording(signals: tuple[int, ...] = SIGNALS) -> None:
    """From now on each of `signals` is only recorded (`record`): for a program's start, while
    its modules load; its command's `raising` block replaces the handlers."""
    if _in_main_thread():
        for sig in signals:
            signal.signal(sig, record)


@contextlib.contextmanager
def raising(signals: tuple[int, ...] = SIGNALS, deadline: Callable[[int], None] | None = None) -> Iterator[None]:
    """Each of `signals` raises inside the block (`raise_interrupt`), in the main thread (other
    threads cannot set handlers: there it does nothing), and an interrupt swallowed where it
    cannot propagate is raised again (`_swallowed`). With `deadline`, `deadline(signum)` runs
    (in the block's watcher thread, `_watch`) once the first signal is `GRACE_S` old and the
    block still runs; it should end the process. The previous handlers come back after (Python's own for those
    that only recorded: `recording`). Not nested."""
    if not _in_main_thread():
        yield
        return
    wake, _wake[:] = tuple(_above_std(fd) for fd in os.pipe()), []
    os.set_blocking(wake[1], False)
    running = threading.Event()
    running.set()
    watcher = threading.Thread(target=_watch, args=(wake[0], deadline, running), name="shardsim-signals", daemon=True)
    watcher.start()
    _wake.append(wake[1])
    if _received:  # it came before the block
        _tell(FIRST)
    previous = {sig: signal.signal(sig, raise_interrupt) for sig in signals}
    hook, sys.unraisablehook = sys.unraisablehook, _swallowed
    try:
        yield
    finally:
        running.clear()
        _wake.clear()
        with contextlib.suppress(OSError):
            os.write(wake[1], DONE)
        os.close(wake[1])
        if not _received:
            watcher.join()  # at once: the pipe is closed (one signalled leaves it to end with the process)
        sys.unraisablehook = hook
        for sig, handler in previous.items():
            signal.signal(sig, _python_default(sig) if handler is record else handler)


def _above_std(fd: int) -> int:
    """`fd`, moved above the standard streams' descriptors (one may be closed at the start:
    its number is for `/dev/null`, not for this)."""
    if fd > 2:
        return fd
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return high


def _python_default(sig: int):
    return signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL


@contextlib.contextmanager
def held(signals: tuple[int, ...] = SIGNALS) -> Iterator[None]:
    """The block runs with `signals` blocked, delivered after it: a process forked inside it
    starts with them blocked until it sets its own handlers (`worker_signals`), instead of
    running this process's handlers meanwhile."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl() if sys.platform == "linux" else None  # looked up here, not in a forked child


def worker_signals(parent: int | None = None) -> None:
    """In a process a command forked to work for it: the signals that end the command are the
    command's to handle (it kills its workers). Ctrl-C and SIGQUIT are ignored (a terminal sends
    them to the whole process group; no core dump), SIGTERM and SIGHUP end the worker at once
    and silently, whatever handler it inherited. With `parent` (the command's pid, taken before
    the fork), the worker is killed when the command ends however it ends (Linux:
    ``prctl(PR_SET_PDEATHSIG)``), and ends now if the command is already gone."""
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # forked while they were held (`held`)
    if parent is not None:
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(0)


def adopt_orphans(on: bool) -> bool:
    """Whether this process now adopts the orphans among its descendants (Linux:
    ``prctl(PR_SET_CHILD_SUBREAPER)``), so that it can reap the processes of a tree it kills
    (where the system's first process reaps none, they would stay as zombies). False where the
    call is not available."""
    return _PRCTL is not None and _PRCTL(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
