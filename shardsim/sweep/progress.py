"""A sweep's progress on stderr: on a terminal a bar with the time left; elsewhere, when asked
(-v), a line every few seconds. The time left is estimated from the share of the sweep's
estimated work done (`Candidate.cost_estimate`, the most expensive predictions first) and the
time it took."""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import Literal

log = logging.getLogger("shardsim")

LINE_EVERY_S = 5.0  # at most one progress line this often (lines mode)
Mode = Literal["bar", "lines"] | None


def time_left(elapsed: float, work: float) -> float | None:
    """Seconds left when a share `work` (0..1) of the sweep took `elapsed` seconds; None before any."""
    if work <= 0:
        return None
    return max(0.0, elapsed * (1.0 - work) / work)


def format_duration(seconds: float) -> str:
    """12 s, 3 min 05 s, 1 h 02 min."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def left_text(elapsed: float, work: float, done: int, total: int) -> str:
    """ "about 1 min 20 s left", or "estimating" before the first prediction is done."""
    left = time_left(elapsed, work)
    if done >= total:
        return "done"
    return "estimating" if left is None or done == 0 else f"about {format_duration(left)} left"


class SweepProgress:
    """`predict_all`'s progress callback, shown on stderr in `mode` (None: nothing); a context
    manager that takes a bar off the terminal at the end. The bar (and its refresh thread) starts
    at the first call, which comes once the worker processes exist."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.start = 0.0
        self.last_line = 0.0
        self.bar = None
        self.task = None

    def __call__(self, done: int, total: int, work: float) -> None:
        if self.mode is None:
            return
        now = time.monotonic()
        if not self.start:
            self.start = self.last_line = now
            if self.mode == "bar":
                self._start_bar(total)
            else:
                log.info("predicting %d configurations", total)
        elapsed = now - self.start
        left = left_text(elapsed, work, done, total)
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=total, left=left)
        elif done >= total or now - self.last_line >= LINE_EVERY_S:
            self.last_line = now
            if done >= total:
                log.info("predicted %d configurations in %s", total, format_duration(elapsed))
            else:
                log.info("predicted %d of %d configurations in %s; %s", done, total, format_duration(elapsed), left)

    def _start_bar(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("predicting"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[left]}"),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task("predict", total=total, left="estimating")
        self.bar.start()

    def __enter__(self) -> SweepProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.bar is not None:
            self.bar.stop()
