"""The engine's clock (bare calls on simpy's queue) fires as simpy's timeouts do, so simulations
on it are the same to the bit."""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.simulator.clock import Clock, call_in
from shardsim.simulator.network.collectives import GroupLayout, PhaseRun, plan, steps_of
from shardsim.simulator.network.fluid import Network
from shardsim.simulator.network.links import build_links
from shardsim.specs.hardware.topology import make_cluster

# a call: its delay (ties likely) and the delays of the calls it makes when it fires
calls_st = st.lists(
    st.tuples(st.sampled_from([0.0, 0.5, 1.0, 0.1 + 0.2]), st.lists(st.sampled_from([0.0, 0.3, 1.0]), max_size=3)),
    min_size=1,
    max_size=12,
)


def _fired(env: Clock | simpy.Environment, calls: list[tuple[float, list[float]]]) -> list[tuple[str, float]]:
    later = call_in(env)
    out: list[tuple[str, float]] = []

    def fire(name: str, then: list[float]) -> None:
        out.append((name, env.now))
        for j, d in enumerate(then):
            later(d, lambda n: out.append((n, env.now)), f"{name}.{j}")

    for i, (delay, then) in enumerate(calls):
        later(delay, lambda a: fire(*a), (str(i), then))
    env.run()
    return out


@settings(max_examples=100, deadline=None, derandomize=True)
@given(calls=calls_st)
def test_the_clock_calls_in_simpys_order_at_its_times(calls) -> None:
    assert _fired(Clock(), calls) == _fired(simpy.Environment(), calls)


def _finish(env: Clock | simpy.Environment, calls: list[tuple[float, tuple, float]]) -> list[float]:
    g_cap = CLUSTER.capacity
    net = Network(env, g_cap)
    finish = [0.0] * len(calls)
    for i, (at, steps, nbytes) in enumerate(calls):
        run = PhaseRun(net, steps, nbytes, str(i), lambda i=i: finish.__setitem__(i, env.now))
        net.call_in(at, run.next)
    env.run()
    return finish


CLUSTER = build_links(make_cluster("g4dn.12xlarge", 4))
_W = CLUSTER.cluster.world
COLLECTIVES = [
    plan(CLUSTER, "all_gather", GroupLayout(0, _W, 4), "hierarchical"),
    plan(CLUSTER, "all_reduce", GroupLayout(0, _W, 4, strided=True), "ring"),
    plan(CLUSTER, "reduce_scatter", GroupLayout(0, _W, _W), "ring"),
    plan(CLUSTER, "send_recv", GroupLayout(0, _W, 2, strided=True), "ring"),
]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from([0.0, 1e-3, 2.5e-3]), st.integers(0, len(COLLECTIVES) - 1), st.floats(1e5, 1e9)),
        min_size=1,
        max_size=10,
    )
)
def test_collectives_sharing_the_network_end_at_the_same_times_on_the_clock_as_on_simpy(calls) -> None:
    """Concurrent collectives, started at times that tie, contending for links: the same finish
    times, to the bit, on the clock and on simpy.Environment."""
    steps = [(at, steps_of(COLLECTIVES[k]), nbytes) for at, k, nbytes in calls]
    assert _finish(Clock(), steps) == _finish(simpy.Environment(), steps)


def test_calls_scheduled_for_one_time_run_in_the_order_scheduled() -> None:
    clock, seen = Clock(), []
    for name in "abc":
        clock.call_in(1.0, seen.append, name)
    clock.call_in(0.5, seen.append, "first")
    clock.run()
    assert seen == ["first", "a", "b", "c"] and clock.now == 1.0


def test_the_clock_starts_at_simpys_time_zero() -> None:
    """An op that starts at once records simpy's start, 0 (an int), in its span and its trace."""
    assert repr(Clock().now) == repr(simpy.Environment().now)
