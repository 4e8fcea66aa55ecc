"""The engine's event clock: calls at times to come, in the order simpy.Environment fires
timeouts, for less per event (no event objects, no processes)."""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

import simpy


class Clock:
    """Calls `fn(arg)` `delay` seconds from now (`call_in`), in order of time, then of scheduling:
    the order in which simpy.Environment fires timeouts of one priority, so a simulation is the
    same to the bit on either. `now` is the time of the call being made."""

    __slots__ = ("now", "_queue", "_scheduled")

    def __init__(self) -> None:
        self.now: float = 0  # the int 0, as simpy's: an op that starts at once starts at 0, not 0.0
        self._queue: list[tuple[float, int, Callable[[Any], object], Any]] = []
        self._scheduled = 0

    def call_in(self, delay: float, fn: Callable[[Any], object], arg: Any = None) -> None:
        """Call `fn(arg)` `delay` (>= 0) seconds from now."""
        self._scheduled += 1
        heappush(self._queue, (self.now + delay, self._scheduled, fn, arg))

    def run(self) -> None:
        """Make the calls until none is left (those they schedule included)."""
        queue = self._queue
        while queue:
            self.now, _, fn, arg = heappop(queue)
            fn(arg)


def call_in(env: Clock | simpy.Environment) -> Callable[[float, Callable[[Any], object], Any], None]:
    """`env`'s `call_in`: a Clock's own, or on a simpy.Environment a timeout whose callback calls it."""
    if isinstance(env, Clock):
        return env.call_in

    def later(delay: float, fn: Callable[[Any], object], arg: Any = None) -> None:
        env.timeout(delay).callbacks.append(lambda _ev: fn(arg))

    return later
