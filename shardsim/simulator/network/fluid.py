"""A fluid network on a simpy.Environment (the engine's is a `clock.Clock`): transfers share
links max-min fairly.

A transfer is a set of bytes on a set of links (a whole collective phase, all its ring
edges at once): it progresses from 0 to 1 at a rate limited by its most loaded link.
Concurrent transfers through one link split its bandwidth. The allocation is max-min fair
on *slowdown*: every transfer is slowed by the same factor on a shared bottleneck, then
transfers not limited there take what is left (progressive filling, fairshare.py). Rates
change only when a transfer starts or ends, so a collective costs O(1) events whatever
its number of ranks.

Incremental allocation (the allocation of progressive filling over every active transfer,
found on a smaller problem):
- a link is *oversubscribed* when the demands of its transfers at their alone rates exceed
  its capacity; only such links can ever bind (every slowdown is <= 1), so a transfer
  through none of them runs at its alone rate;
- transfers interact only through the oversubscribed links they share: the allocation
  splits into independent components, and a start or an end can only change the rates in
  its own component (before and after): only those are refilled.
One timer is armed at the next completion; a start re-arms it only when something
now ends sooner. Progress is kept as (remaining at t0, rate since t0) and brought up to
date only when a rate changes.

Held links: a holder (the engine's `idle_chain.IdleChain`) may take links that carry nothing
(`idle`, `hold`) and time its own transfers on them at their alone rates, off the network. The
first transfer sent over a held link has the holder `interrupt()`ed first: it releases its links
and hands its transfer in flight back (`send(..., since=)`, as if sent then), so the network is
as if the holder's transfers had been sent to it all along.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np
import simpy

from shardsim.simulator.clock import Clock, call_in
from shardsim.simulator.network.fairshare import fill

_EPS = 1e-9  # a transfer this close to done is done (float drift)


@dataclass(frozen=True, eq=False)
class Route:
    """Links and bytes per link of one byte sent (a collective phase: one for every call)."""

    links: tuple[int, ...]  # unique
    unit: tuple[float, ...]  # bytes on each link per byte sent

    @staticmethod
    def of(links: np.ndarray, unit: np.ndarray) -> Route:
        keep = unit > 0  # a link that carries nothing is not on the route
        return Route(tuple(links[keep].tolist()), tuple(unit[keep].tolist()))

    @cached_property
    def position(self) -> dict[int, int]:
        """link -> its index in `links`."""
        return {link: i for i, link in enumerate(self.links)}


class Holder(Protocol):
    """What holds idle links (`Network.hold`): told when a transfer is sent over one of them."""

    def interrupt(self) -> None:
        """Release the links held and hand any transfer in flight on them back (`send(since=)`)."""


@dataclass(eq=False, slots=True)
class Transfer:
    route: Route
    demand: list[float]  # bytes/s on each link of the route at the alone rate
    alone_rate: float  # progress/s when alone on the network
    seq: int  # start order (sums over a component run in it)
    on_done: Callable[[], object]
    t0: float  # `remaining` and `rate` hold since t0
    remaining: float = 1.0
    rate: float = 0.0
    tag: str = ""
    over: set[int] = field(default_factory=set)  # its oversubscribed links
    yields: bool = False  # takes only what the others leave on a shared link (fairshare.fill)


@dataclass
class Network:
    env: simpy.Environment | Clock
    capacity: np.ndarray
    active: dict[Transfer, None] = field(default_factory=dict)  # in start order
    _started: int = 0
    _shapes: dict[Route, tuple[float, list[float]]] = field(default_factory=dict)  # route -> alone rate
    # of one byte, demand on each link at the alone rate (the same whatever the bytes)
    _users: dict[int, dict[Transfer, None]] = field(default_factory=dict)  # oversubscribed link -> transfers
    _timer: int = 0  # the armed timer's number (a timer armed before it is stale when it fires)
    _timer_at: float = float("inf")
    _target: tuple[Transfer, float, float] | None = None  # the timer's transfer, its (t0, rate) then
    _yielding: bool = False  # some transfer yields: allocations pass who does (none: no list built)

    def __post_init__(self) -> None:
        self._cap: list[float] = self.capacity.tolist()
        self._usage = [0.0] * len(self._cap)  # demand at alone rates per link (bytes/s)
        self._count = [0] * len(self._cap)  # transfers per link
        self._held: list[Holder | None] = [None] * len(self._cap)  # link -> its holder (`hold`)
        self._holders = 0  # links held
        self.call_in = call_in(self.env)  # call_in(delay, fn, arg): fn(arg) that many seconds from now

    def transfer(
        self, links: np.ndarray, load: np.ndarray, tag: str = "", max_rate: float | None = None
    ) -> simpy.Event:
        """Start moving `load[i]` units over `links[i]` now; the event fires when done.

        `max_rate` caps the progress rate (1/duration) for work that cannot go faster than
        alone however idle the resource is (a rank computes on at most one core)."""
        done = self.env.event()
        self.send(Route.of(links, load), 1.0, tag, done.succeed, max_rate)
        return done

    def send(
        self,
        route: Route,
        nbytes: float,
        tag: str,
        on_done: Callable[[], object],
        max_rate: float | None = None,
        yields: bool = False,
        since: float | None = None,
    ) -> None:
        """Move `nbytes` × route.unit over route.links from now; `on_done()` runs when done
        (at once when there is nothing to move). `yields`: it gets what the transfers that do
        not yield leave on its links (compute on a host's cores, see fairshare.fill). `since`: it
        has moved at its alone rate since then (a holder's transfer handed back; its links idle)."""
        if nbytes <= 0 or not route.links:  # (route units are > 0)
            on_done()
            return
        if self._holders:
            held = self._held
            for link in route.links:
                h = held[link]
                if h is not None:
                    h.interrupt()
        shape = self._shapes.get(route) or self._shape(route)
        # alone rate and demand at it, from the route's (rounded once: may differ from
        # computing them for these bytes in the last bit)
        alone, demand = shape[0] / nbytes, shape[1]
        if max_rate is not None and max_rate < alone:
            alone, demand = max_rate, [u * nbytes * max_rate for u in route.unit]
        now = self.env._now
        t = Transfer(
            route, demand, alone, self._started, on_done, now if since is None else since, tag=tag, yields=yields
        )
        if yields:
            self._yielding = True
        self._started += 1
        self.active[t] = None
        if since is not None:
            t.rate = alone  # its progress since then: brought up to date by a refill, or when armed
        if self._add_load(t):
            changed = self._refill([t])
            if since is not None and t not in changed:
                changed.append(t)
        else:
            t.rate = alone
            changed = (t,)
        for c in changed:  # re-arm only when something now ends before the armed timer
            left = c.remaining - c.rate * (now - c.t0)
            if now + left / c.rate < self._timer_at:
                self._arm(c, left)

    def _shape(self, route: Route) -> tuple[float, list[float]]:
        """`route`'s alone rate of one byte and its demand on each link at that rate (cached)."""
        cap = self._cap
        per_byte = min([cap[link] / u for link, u in zip(route.links, route.unit, strict=True)])
        shape = self._shapes[route] = (per_byte, [u * per_byte for u in route.unit])
        return shape

    def alone_s(self, route: Route, nbytes: float) -> float:
        """Seconds `nbytes` over `route` take alone on its links: the delay of the timer `send` arms
        for them (0 when nothing moves)."""
        if nbytes <= 0 or not route.links:
            return 0.0
        shape = self._shapes.get(route) or self._shape(route)
        return max(1.0 / (shape[0] / nbytes), 0.0)

    # -- held links (a holder times its transfers itself while nothing else uses them) -----------
    def idle(self, links: tuple[int, ...]) -> bool:
        """No transfer is on `links` and no holder holds any of them."""
        count, held = self._count, self._held
        return not any(count[link] or held[link] is not None for link in links)

    def hold(self, links: tuple[int, ...], holder: Holder) -> None:
        """`holder` takes `links` (idle): the first transfer sent over one interrupts it."""
        for link in links:
            self._held[link] = holder
        self._holders += len(links)

    def release(self, links: tuple[int, ...]) -> None:
        """Give `links` back (held by one holder)."""
        for link in links:
            self._held[link] = None
        self._holders -= len(links)

    # -- link bookkeeping ------------------------------------------------------------
    def _add_load(self, t: Transfer) -> bool:
        """Count t's demand on its links; True when it crosses an oversubscribed link."""
        usage, count, cap = self._usage, self._count, self._cap
        fresh = []
        for link, d in zip(t.route.links, t.demand, strict=True):
            u = usage[link] + d
            usage[link] = u
            count[link] += 1
            if u > cap[link]:
                fresh.append(link)
        for link in fresh:
            users = self._users.get(link)
            if users is None:  # newly oversubscribed: find who crosses it
                users = self._users[link] = {a: None for a in self.active if link in a.route.position}
                for a in users:
                    a.over.add(link)
            else:
                users[t] = None
                t.over.add(link)
        return bool(fresh)

    def _remove_load(self, t: Transfer, dirty: dict[Transfer, None]) -> None:
        """Take t's demand off its links; the transfers it was contending with go to `dirty`."""
        usage, count = self._usage, self._count
        for link, d in zip(t.route.links, t.demand, strict=True):
            count[link] -= 1
            usage[link] = usage[link] - d if count[link] else 0.0  # an idle link: no float drift left behind
        for link in t.over:
            users = self._users[link]
            del users[t]
            dirty.update(users)
            if usage[link] <= self._cap[link]:
                for a in users:
                    a.over.discard(link)
                del self._users[link]

    # -- allocation ------------------------------------------------------------------
    def _component(self, seed: Transfer, seen: set[Transfer]) -> list[Transfer]:
        comp, stack = [], [seed]
        seen.add(seed)
        while stack:
            t = stack.pop()
            comp.append(t)
            for link in t.over:
                for a in self._users[link]:
                    if a not in seen:
                        seen.add(a)
                        stack.append(a)
        return comp

    def _refill(self, seeds) -> list[Transfer]:
        """New rates for the components of `seeds` (progressive filling on each); returns
        the transfers whose rate was set."""
        now = self.env._now
        seen: set[Transfer] = set()
        out: list[Transfer] = []
        for seed in seeds:
            if seed in seen:
                continue
            if not seed.over:
                comp, xs = [seed], [1.0]
            else:
                comp = sorted(self._component(seed, seen), key=lambda t: t.seq)
                rows = [[(link, t.demand[t.route.position[link]]) for link in t.over] for t in comp]
                xs = fill(rows, self._cap, [t.yields for t in comp] if self._yielding else None)
            for t, x in zip(comp, xs, strict=True):
                rate = x * t.alone_rate
                if rate != t.rate:
                    t.remaining -= t.rate * (now - t.t0)
                    t.t0, t.rate = now, rate
                    out.append(t)
        return out

    # -- time ------------------------------------------------------------------------
    def _arm(self, t: Transfer, left: float) -> None:
        delay = max(left / t.rate, 0.0)
        self._timer += 1
        self.call_in(delay, self._on_timer, self._timer)
        self._timer_at = self.env._now + delay
        self._target = (t, t.t0, t.rate)

    def _on_timer(self, timer: int) -> None:
        if timer != self._timer:
            return  # superseded by a transfer that ends sooner
        target, t0, rate = self._target  # type: ignore[misc]
        self._timer += 1  # none armed
        self._timer_at, self._target = float("inf"), None
        now = self.env._now
        if target.t0 == t0 and target.rate == rate:
            # its rate has not changed since the timer was set for it: it is done by definition,
            # even when its last sliver of time is below float resolution at this clock value
            target.remaining, target.t0 = 0.0, now
        active = self.active
        finished = [t for t in active if t.remaining - t.rate * (now - t.t0) <= _EPS]
        if finished:
            dirty: dict[Transfer, None] = {}
            for t in finished:
                del active[t]
            for t in finished:
                self._remove_load(t, dirty)
            for t in finished:
                dirty.pop(t, None)
            if dirty:
                self._refill(dirty)
        if len(active) == 1:  # the usual case: nothing to compare
            nxt = next(iter(active))
            self._arm(nxt, nxt.remaining - nxt.rate * (now - nxt.t0))
        elif active:  # the first to end (the first started of those that end together), as min() finds it
            them = iter(active)
            nxt = next(them)
            soonest = (nxt.remaining - nxt.rate * (now - nxt.t0)) / nxt.rate
            for t in them:
                left = (t.remaining - t.rate * (now - t.t0)) / t.rate
                if left < soonest:
                    nxt, soonest = t, left
            self._arm(nxt, nxt.remaining - nxt.rate * (now - nxt.t0))
        for t in finished:
            t.on_done()
