"""How a signal ends a shardsim command: SIGINT raises KeyboardInterrupt; SIGTERM, SIGHUP and
SIGQUIT raise `Terminated`, a KeyboardInterrupt too, so that every cleanup written for Ctrl-C
runs for each of them; the CLI turns any of them into one line and exit status 128 + the
signal's number (130, 143, 129, 131), as a shell reports a process the signal ended."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

# the signals that end a command (each raises inside it, so that what it started is stopped)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
STATUSES = frozenset(128 + s for s in SIGNALS)  # the exit statuses they give


class Terminated(KeyboardInterrupt):
    """SIGTERM, SIGHUP or SIGQUIT arrived (`signum`)."""

    def __init__(self, signum: int = signal.SIGTERM):
        self.signum = signal.Signals(signum)
        super().__init__(f"signal {self.signum.name}")

    def __reduce__(self):
        return type(self), (int(self.signum),)


def raise_interrupt(signum: int, frame) -> None:
    """A signal handler: KeyboardInterrupt for SIGINT, Terminated for any other signal."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt("signal SIGINT")
    raise Terminated(signum)


def exit_status(exc: KeyboardInterrupt) -> int:
    """128 + the number of the signal that raised `exc` (Ctrl-C's when it names none)."""
    return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)


def describe(exc: KeyboardInterrupt) -> str:
    """What a command that `exc` ended says: ``interrupted`` (Ctrl-C), ``terminated`` (SIGTERM),
    ``terminated (SIGHUP)``, ``terminated (SIGQUIT)``."""
    if not isinstance(exc, Terminated):
        return "interrupted"
    return "terminated" if exc.signum == signal.SIGTERM else f"terminated ({exc.signum.name})"


@contextlib.contextmanager
def raising(signals: tuple[int, ...] = SIGNALS) -> Iterator[None]:
    """Each of `signals` raises inside the block (`raise_interrupt`), in the main thread (other
    threads cannot set handlers: there it does nothing); the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, raise_interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def worker_signals() -> None:
    """In a process a command forked to work for it: the signals that end the command are the
    command's to handle (it kills its workers). Ctrl-C and SIGQUIT are ignored (a terminal sends
    them to the whole process group; no core dump), SIGTERM and SIGHUP end the worker at once
    and silently, whatever handler it inherited."""
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
