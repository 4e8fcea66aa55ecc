"""The engine's event clock: a simpy.Environment that also takes bare calls (`call_in`). A call is
a slotted record on simpy's own event queue (what simpy's loop reads of an event: its callbacks,
and that it succeeded), fired by simpy's loop in simpy's order (time, then priority, then
scheduling) among the simulation's other events, without a Timeout object, a value or a
callback list of its own per call."""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappush
from typing import Any

import simpy
from simpy.events import NORMAL


class _Call:
    """One call on simpy's queue: `fn(arg)`, made by simpy's loop through `callbacks`."""

    __slots__ = ("callbacks", "_ok", "fn", "arg")

    def __init__(self, fn: Callable[[Any], object], arg: Any) -> None:
        self.callbacks = _MAKE  # simpy's loop takes it and sets None, as an event's
        self._ok = True  # a call never fails: simpy's loop checks this after the callbacks
        self.fn, self.arg = fn, arg


def _make(call: _Call) -> None:
    call.fn(call.arg)


_MAKE = (_make,)


class Clock(simpy.Environment):
    """A simpy.Environment (time from the int 0, `run`, `timeout`, processes) that also calls
    `fn(arg)` `delay` seconds from now (`call_in`) or at a time (`call_at`), at NORMAL priority as a
    timeout made now."""

    def call_in(self, delay: float, fn: Callable[[Any], object], arg: Any = None) -> None:
        """Call `fn(arg)` `delay` (>= 0) seconds from now: simpy's `schedule`, its entry pushed here."""
        heappush(self._queue, (self._now + delay, NORMAL, next(self._eid), _Call(fn, arg)))  # type: ignore[arg-type]

    def call_at(self, when: float, fn: Callable[[Any], object], arg: Any = None) -> None:
        """Call `fn(arg)` at time `when` (>= now), as `call_in` would at that time."""
        heappush(self._queue, (when, NORMAL, next(self._eid), _Call(fn, arg)))  # type: ignore[arg-type]


def call_in(env: simpy.Environment) -> Callable[[float, Callable[[Any], object], Any], None]:
    """`env`'s `call_in`: a Clock's own, or on another simpy.Environment a timeout whose callback calls it."""
    if isinstance(env, Clock):
        return env.call_in

    def later(delay: float, fn: Callable[[Any], object], arg: Any = None) -> None:
        env.timeout(delay).callbacks.append(lambda _ev: fn(arg))

    return later
