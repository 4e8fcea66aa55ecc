"""How a signal ends a shardsim command: SIGINT raises KeyboardInterrupt and SIGTERM raises
`Terminated`, a KeyboardInterrupt too, so that every cleanup written for Ctrl-C runs for both;
the CLI turns either into one line and exit status 128 + the signal's number (130, 143)."""

from __future__ import annotations

import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived."""


def raise_interrupt(signum: int, frame) -> None:
    """A signal handler: Terminated for SIGTERM, KeyboardInterrupt for any other signal."""
    name = signal.Signals(signum).name
    raise Terminated(f"signal {name}") if signum == signal.SIGTERM else KeyboardInterrupt(f"signal {name}")


def exit_status(exc: KeyboardInterrupt) -> int:
    """128 + the number of the signal that raised `exc`, as a shell reports a process it ended."""
    return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
