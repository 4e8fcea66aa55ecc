"""A chain of collectives on idle links, timed as one event (the engine's fast path).

Tensor parallelism issues a chain of collectives after each block's compute op (all-gather,
reduce-scatter, ... on the `tp` stream, each waiting only for the one before, the next compute op
for the last): most of a large plan's ops, each a latency call, a transfer and its timer on the
clock. When such a chain starts and every link its collectives use is idle (no transfer on it, no
other chain holding it), the chain holds those links on the network (`Network.hold`) and is
timed at once, each collective at its alone rate, as the network would time it: its latency
after the previous one ends, then `Network.alone_s` of its bytes. One call on the clock ends the
chain; its ops' spans are recorded then.

Exact: a transfer whose links carry nothing else runs at its alone rate, and the first transfer
sent over a held link interrupts the chain first (`interrupt`): the ops already over end where
they ended, the one in its latency sends at its latency's end, the one moving bytes is handed to
the network as sent at its start (`Network.send(since=)`), and the rest run as any op does. So
every span is what the network without the fast path gives, up to float rounding (the same sums
in another order, and transfers that end together ending in another order): the step within a
relative 1e-12 (`tests/unit/test_idle_chain.py` compares the two on many plans).
NCCL's SM share (`engine.SmSharing`) sees one collective in flight from the chain's start to its
end, as it does op by op (the count drops to 0 and back at the same instant between two ops).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardsim.simulator.engine import _Run
    from shardsim.simulator.network.fluid import Route
    from shardsim.simulator.plan import Op


class IdleChain:
    """Ops `ops` (one phase each, one route each: `routes`), each waiting only for the one before,
    started at `start` on idle links: holds the links and ends the chain with one call."""

    __slots__ = ("run", "ops", "routes", "links", "starts", "sends", "ends", "done", "live", "held")

    def __init__(
        self,
        run: _Run,
        ops: list[Op],
        routes: list[Route],
        latencies: list[float],
        links: tuple[int, ...],
        start: float,
    ) -> None:
        self.run, self.ops, self.routes, self.links = run, ops, routes, links
        net = run.net
        starts, sends, ends = [], [], []
        t = start
        for op, route, latency in zip(ops, routes, latencies, strict=True):
            starts.append(t)
            t = t + latency if latency else t  # the latency's call (`_Run.begin`), then the send
            sends.append(t)
            t = t + net.alone_s(route, op.nbytes)  # the timer the network arms for it alone
            ends.append(t)
        self.starts, self.sends, self.ends = starts, sends, ends
        self.done = 0  # ops whose span is recorded
        self.live = True  # its end call is still to end it
        self.held = True
        net.hold(links, self)
        run.env.call_at(t, IdleChain._end, self)

    def _end(self) -> None:
        """The clock's call at the last op's end."""
        if not self.live:
            return
        self._release()
        last = len(self.ops) - 1
        self._close(last)
        self.run.end(self.ops[last], self.starts[last])

    def interrupt(self) -> None:
        """A transfer is sent over a held link now: release the links, and run the rest of the
        chain on the network as op-by-op runs would have had it (see the module's docstring)."""
        self._release()
        run = self.run
        now = run.env._now
        ends = self.ends
        j = self.done
        while j < len(ends) and ends[j] <= now:
            j += 1
        if j == len(ends):  # all over now: its end call, due now, ends it
            return
        self.live = False
        self._close(j)
        op, start, route = self.ops[j], self.starts[j], self.routes[j]
        if now < self.sends[j]:
            run.env.call_at(self.sends[j], run._send, (op, start, route))
        else:
            run.net.send(route, op.nbytes, op.name, partial(run.end, op, start), since=self.sends[j])

    def _release(self) -> None:
        if self.held:
            self.held = False
            self.run.net.release(self.links)

    def _close(self, upto: int) -> None:
        """Record the spans of ops [done, upto), over: each ended where the next started."""
        run = self.run
        for i in range(self.done, upto):
            op = self.ops[i]
            run.spans[op.id] = run.span(op, self.starts[i], self.ends[i])
            run.waiting[self.ops[i + 1].id] = 0
        run.ended += upto - self.done
        self.done = upto
