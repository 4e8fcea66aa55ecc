"""A fluid network in simpy: transfers share links max-min fairly.

A transfer is a set of bytes on a set of links (a whole collective phase, all its ring
edges at once): it progresses from 0 to 1 at a rate limited by its most loaded link.
Concurrent transfers through one link split its bandwidth. The allocation is max-min fair
on *slowdown*: every transfer is slowed by the same factor on a shared bottleneck, then
transfers not limited there take what is left (progressive filling). Rates are
recomputed only when a transfer starts or ends, so a collective costs O(1) events
whatever its number of ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

_EPS = 1e-9  # a transfer this close to done is done (float drift)


@dataclass(eq=False)
class Transfer:
    links: np.ndarray  # link indices (unique)
    load: np.ndarray  # bytes on each of those links for the whole transfer
    done: simpy.Event
    alone_rate: float  # progress/s when alone on the network
    remaining: float = 1.0
    rate: float = 0.0
    tag: str = ""


@dataclass
class Network:
    env: simpy.Environment
    capacity: np.ndarray
    active: list[Transfer] = field(default_factory=list)
    busy_time: float = 0.0
    _t_last: float = 0.0
    _wake: simpy.Event | None = None

    def __post_init__(self) -> None:
        self.env.process(self._run())

    def transfer(
        self, links: np.ndarray, load: np.ndarray, tag: str = "", max_rate: float | None = None
    ) -> simpy.Event:
        """Start moving `load[i]` units over `links[i]` now; the event fires when done.

        `max_rate` caps the progress rate (1/duration) for work that cannot go faster than
        alone however idle the resource is (a rank computes on at most one core)."""
        done = self.env.event()
        if links.size == 0 or float(load.max(initial=0.0)) <= 0:
            done.succeed()
            return done
        alone = float(np.min(self.capacity[links] / load))
        if max_rate is not None:
            alone = min(alone, max_rate)
        self._advance()
        self.active.append(Transfer(links, load, done, alone, tag=tag))
        self._reallocate()
        self._poke()
        return done

    # -- internals -------------------------------------------------------------------
    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _advance(self) -> None:
        dt = self.env.now - self._t_last
        if dt > 0 and self.active:
            for t in self.active:
                t.remaining -= t.rate * dt
            self.busy_time += dt
        self._t_last = self.env.now

    def _reallocate(self) -> None:
        """Progressive filling on the slowdown factor x (rate = x * alone_rate)."""
        act = self.active
        if not act:
            return
        if len(act) == 1:
            act[0].rate = act[0].alone_rate
            return
        all_links = np.unique(np.concatenate([t.links for t in act]))
        cap = self.capacity[all_links]
        demand = np.zeros((len(act), all_links.size))  # bytes/s on each link at x = 1
        for i, t in enumerate(act):
            demand[i, np.searchsorted(all_links, t.links)] = t.load * t.alone_rate
        x = np.zeros(len(act))
        frozen = np.zeros(len(act), dtype=bool)
        while not frozen.all():
            used = x[frozen] @ demand[frozen] if frozen.any() else np.zeros(all_links.size)
            free_demand = demand[~frozen].sum(axis=0)
            with np.errstate(divide="ignore", invalid="ignore"):
                level = np.where(free_demand > 0, (cap - used) / free_demand, np.inf)
            x_star = min(float(level.min()), 1.0)
            x[~frozen] = x_star
            if x_star >= 1.0:
                break
            tight = level <= x_star * (1 + 1e-9)
            hit = (demand[:, tight] > 0).any(axis=1) & ~frozen
            frozen |= hit
        for t, xi in zip(act, x, strict=True):
            t.rate = xi * t.alone_rate

    def _run(self):
        while True:
            self._wake = self.env.event()
            if not self.active:
                yield self._wake
                continue
            target = min(self.active, key=lambda t: t.remaining / t.rate)
            timer = self.env.timeout(max(target.remaining / target.rate, 0.0))
            fired = yield timer | self._wake
            self._advance()
            if timer in fired:
                # the timer was set for `target`: it is done by definition, even when its last
                # sliver of time is below float resolution at this clock value
                target.remaining = 0.0
            finished = [t for t in self.active if t.remaining <= _EPS]
            if finished:
                self.active = [t for t in self.active if t.remaining > _EPS]
                self._reallocate()
                for t in finished:
                    t.done.succeed()
