"""The network's incremental max-min allocation equals progressive filling over every transfer."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.simulator.network.collectives import GroupLayout, PhaseRun, plan, steps_of
from shardsim.simulator.network.fairshare import fill
from shardsim.simulator.network.fluid import Network
from shardsim.simulator.network.linkgroups import group_links
from shardsim.simulator.network.links import build_links
from shardsim.specs.hardware.topology import make_cluster


def full_filling(capacity: np.ndarray, transfers: list[tuple[np.ndarray, np.ndarray]]) -> list[float]:
    """Reference: progressive filling on the slowdown over all transfers and all their links
    (the network's allocation before it became incremental). transfers: (links, demand at x=1)."""
    all_links = np.unique(np.concatenate([links for links, _ in transfers]))
    cap = capacity[all_links]
    demand = np.zeros((len(transfers), all_links.size))
    for i, (links, d) in enumerate(transfers):
        demand[i, np.searchsorted(all_links, links)] = d
    x = np.zeros(len(transfers))
    frozen = np.zeros(len(transfers), dtype=bool)
    while not frozen.all():
        used = x[frozen] @ demand[frozen] if frozen.any() else np.zeros(all_links.size)
        free = demand[~frozen].sum(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            level = np.where(free > 0, (cap - used) / free, np.inf)
        x_star = min(float(level.min()), 1.0)
        x[~frozen] = x_star
        if x_star >= 1.0:
            break
        tight = level <= x_star * (1 + 1e-9)
        frozen |= (demand[:, tight] > 0).any(axis=1) & ~frozen
    return x.tolist()


def check_rates(net: Network) -> None:
    act = list(net.active)
    if not act:
        return
    ref = full_filling(net.capacity, [(np.array(t.route.links), np.array(t.demand)) for t in act])
    for t, x in zip(act, ref, strict=True):
        assert abs(t.rate / t.alone_rate - x) <= 1e-9 * max(x, 1e-300), (t.tag, t.rate / t.alone_rate, x)


transfer_st = st.tuples(
    st.floats(0.0, 3.0),  # start time
    st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True),  # links
    st.lists(st.floats(0.1, 10.0), min_size=4, max_size=4),  # bytes on each
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    caps=st.lists(st.floats(1.0, 20.0), min_size=6, max_size=6),
    transfers=st.lists(transfer_st, min_size=1, max_size=12),
)
def test_incremental_allocation_equals_full_progressive_filling(caps, transfers) -> None:
    env = simpy.Environment()
    net = Network(env, np.array(caps))
    ended: list[str] = []

    def flow(i: int, at: float, links: list[int], load: list[float]):
        yield env.timeout(at)
        done = net.transfer(np.array(links), np.array(load[: len(links)]), tag=str(i))
        check_rates(net)
        yield done
        ended.append(str(i))
        check_rates(net)

    def watch():
        while net.active or len(ended) < len(transfers):
            yield env.timeout(0.05)
            check_rates(net)

    for i, (at, links, load) in enumerate(transfers):
        env.process(flow(i, at, links, load))
    env.process(watch())
    env.run()
    assert sorted(ended) == sorted(str(i) for i in range(len(transfers)))


def test_fill_freezes_the_tightest_link_first() -> None:
    """Two transfers on link 0 (capacity 10, 10 each at x=1): both at x=1/2; the second also
    crosses link 1 (capacity 30) with a third (30 at x=1), which takes what is left: 25/30."""
    x = fill([[(0, 10.0)], [(0, 10.0), (1, 10.0)], [(1, 30.0)]], [10.0, 30.0])
    assert x == [0.5, 0.5, 25.0 / 30.0]


def _finish_times(net: Network, calls: list[tuple[tuple, float]]) -> list[float]:
    finish = [0.0] * len(calls)
    for i, (steps, nbytes) in enumerate(calls):
        PhaseRun(net, steps, nbytes, str(i), lambda i=i: finish.__setitem__(i, net.env.now)).next()
    net.env.run()
    return finish


def test_merged_links_give_the_same_times_as_every_link() -> None:
    """linkgroups.py: links that always carry the same load merged into one resource change
    no finish time (concurrent collectives contending on ports and NICs)."""
    g = build_links(make_cluster("g4dn.12xlarge", 4))
    w = g.cluster.world
    calls = [
        (plan(g, "all_gather", GroupLayout(0, w, 4), "hierarchical"), 3e8),
        (plan(g, "all_reduce", GroupLayout(0, w, 4, strided=True), "ring"), 1e8),
        (plan(g, "reduce_scatter", GroupLayout(0, w, w), "ring"), 2e8),
        (plan(g, "send_recv", GroupLayout(0, w, 2, strided=True), "ring"), 5e7),
    ]
    every_link = _finish_times(Network(simpy.Environment(), g.capacity), [(steps_of(p), n) for p, n in calls])
    caps, routes = group_links(g.capacity, [ph.route for p, _ in calls for ph in p])
    assert len(caps) < g.n_links
    it = iter(routes)
    merged_calls = [(tuple((ph.latency_s, next(it)) for ph in p), n) for p, n in calls]
    merged = _finish_times(Network(simpy.Environment(), caps), merged_calls)
    assert merged == pytest.approx(every_link, rel=1e-12)
