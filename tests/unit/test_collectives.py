"""Collectives on links: the textbook formulas, sharing, and monotonicity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardsim.simulator.collective import simulate_collective, time_collectives
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.network.fluid import Network
from shardsim.simulator.network.links import build_links
from shardsim.specs.hardware.topology import Cluster, make_cluster
from tests.helpers import instance, one_tier

GB = 1e9


def _link_model(c: Cluster, op: str, size: float, algo: str = "ring") -> float:
    """One call on the link-latency model (a bare algorithm name: no NCCL protocol, the links'
    own latencies), the placement NCCL's path builds on."""
    g = build_links(c)
    return time_collectives(g, [(op, GroupLayout.world(c.world), float(size))], algo, "nccl")[0]


@pytest.mark.parametrize("n", [2, 4, 8, 64])
@pytest.mark.parametrize("size", [1e6, 1e9])
def test_ring_matches_alpha_beta_formulas(n: int, size: float) -> None:
    alpha, gbps = 5e-6, 100.0
    B = gbps * 1e9 / 8
    c = one_tier(n, gbps, alpha * 1e6)
    ar = _link_model(c, "all_reduce", size)
    ag = _link_model(c, "all_gather", size)
    rs = _link_model(c, "reduce_scatter", size)
    expect_ar = 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / B
    expect_ag = (n - 1) * alpha + (n - 1) / n * size / B
    assert ar == pytest.approx(expect_ar, rel=0.01)
    assert ag == pytest.approx(expect_ag, rel=0.01)
    assert rs == pytest.approx(expect_ag, rel=0.01)


def test_tree_matches_formula() -> None:
    """Double binary tree: latency 2·log2(n)·α; bandwidth term 2·(n−1)/n·S/B.

    Our placement puts 2·S on an interior rank's link (half of S up and down each tree),
    which equals the formula's 2(n−1)/n·S up to a factor n/(n−1): within 1 % from n = 128."""
    alpha, gbps = 5e-6, 100.0
    B = gbps * 1e9 / 8
    n = 256
    c = one_tier(n, gbps, alpha * 1e6)
    size = 4e9
    t = _link_model(c, "all_reduce", size, "tree")
    assert t == pytest.approx(2 * math.log2(n) * alpha + 2 * (n - 1) / n * size / B, rel=0.01)
    # latency term alone (tiny message)
    t_small = _link_model(c, "all_reduce", 8, "tree")
    assert t_small == pytest.approx(2 * math.log2(n) * alpha, rel=0.01)
    # and a tree's latency grows as log n while the ring's grows as n
    ring_small = _link_model(c, "all_reduce", 8, "ring")
    assert ring_small > 20 * t_small


def test_two_collectives_sharing_a_nic_take_twice_as_long() -> None:
    c = one_tier(2, 100.0, 0.0)
    g = build_links(c)
    layout = GroupLayout(0, 2, 2)
    size = 1e9
    (alone,) = time_collectives(g, [("all_gather", layout, size)], "ring", "nccl")
    both = time_collectives(g, [("all_gather", layout, size), ("all_gather", layout, size)], "ring", "nccl")
    assert both[0] == pytest.approx(2 * alone, rel=1e-6)
    assert both[1] == pytest.approx(2 * alone, rel=1e-6)


def test_progressive_filling_gives_leftover_capacity_to_unconstrained_transfers() -> None:
    """Max-min fair on slowdown: A and B share link 0 (each slowed to half); C shares link 1
    with B only and takes what B leaves of it (x = 25/30), not B's slowdown."""
    env = simpy.Environment()
    net = Network(env, np.array([10.0, 30.0]))
    ends = {}

    def flow(name, links, load):
        yield net.transfer(np.array(links), np.array(load))
        ends[name] = env.now

    env.process(flow("A", [0], [10.0]))
    env.process(flow("B", [0, 1], [10.0, 10.0]))
    env.process(flow("C", [1], [30.0]))
    env.run()
    assert ends["C"] == pytest.approx(30.0 / 25.0)  # 25 B/s of link 1 while B holds 5
    assert ends["A"] == pytest.approx(2.0)  # half of link 0 throughout
    assert ends["B"] == pytest.approx(2.0)


def test_a_transfer_alone_runs_at_its_bottleneck_rate() -> None:
    env = simpy.Environment()
    net = Network(env, np.array([10.0, 2.0]))
    done = net.transfer(np.array([0, 1]), np.array([20.0, 20.0]))
    env.run(done)
    assert env.now == pytest.approx(10.0)


def test_gloo_reduce_scatter_costs_an_all_reduce() -> None:
    c = one_tier(8)
    rs_gloo = simulate_collective(c, "reduce_scatter", 10**9, backend="gloo").time_s
    ar = _link_model(c, "all_reduce", 10**9)
    rs_nccl = _link_model(c, "reduce_scatter", 10**9)
    assert rs_gloo == pytest.approx(ar)
    assert rs_gloo == pytest.approx(2 * rs_nccl, rel=0.02)


def test_hierarchical_all_gather_keeps_bytes_off_the_nic() -> None:
    """MiCS's point: across nodes only S/k crosses each NIC pair per local rank."""
    c = Cluster(instance(devices=8, nic_gbps=100, port_GBps=300), 4)
    ring = simulate_collective(c, "all_gather", 2**30, algo="ring").time_s
    hier = simulate_collective(c, "all_gather", 2**30, algo="hierarchical").time_s
    assert hier < ring


def test_p4d_single_node_all_reduce_busbw_near_measured() -> None:
    """NVIDIA/nccl issue #527: NCCL all-reduce busbw on one p4d node, 1 GiB: 230.8 GB/s measured.
    The fabric efficiency in p4d.24xlarge.yaml is calibrated on that measurement, so this
    checks that the ring placement on NVSwitch ports turns it back into that busbw."""
    r = simulate_collective(make_cluster("p4d.24xlarge", 1), "all_reduce", 2**30)
    assert r.busbw_GBps == pytest.approx(230.8, rel=0.05)


_ops = st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "broadcast"])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    op=_ops,
    nodes=st.integers(1, 6),
    devices=st.sampled_from([1, 2, 4, 8]),
    gbps=st.floats(1, 400),
    factor=st.floats(1.0, 8.0),
    size=st.integers(1, 2**31),
    algo=st.sampled_from(["ring", "hierarchical"]),
)
def test_more_bandwidth_is_never_slower(op, nodes, devices, gbps, factor, size, algo) -> None:
    """On the link model. (NCCL's path need not be monotone: its tuner may pick a pair that runs
    slower on the faster links, as the real one can.)"""
    assume(nodes * devices >= 2)
    if algo == "hierarchical" and op == "broadcast":
        algo = "ring"
    slow = Cluster(instance(devices=devices, nic_gbps=gbps, port_GBps=50), nodes)
    fast_nic = Cluster(instance(devices=devices, nic_gbps=gbps * factor, port_GBps=50), nodes)
    fast_port = Cluster(instance(devices=devices, nic_gbps=gbps, port_GBps=50 * factor), nodes)
    t = _link_model(slow, op, size, algo)
    assert _link_model(fast_nic, op, size, algo) <= t * (1 + 1e-9)
    assert _link_model(fast_port, op, size, algo) <= t * (1 + 1e-9)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    op=_ops,
    nodes=st.integers(1, 6),
    devices=st.sampled_from([1, 2, 4]),
    size=st.integers(1, 2**30),
    more=st.integers(0, 2**30),
    backend=st.sampled_from(["nccl", "gloo"]),
)
def test_more_bytes_are_never_faster(op, nodes, devices, size, more, backend) -> None:
    """On the link model and gloo. (On NCCL's path a protocol switch of the tuner may make a
    slightly larger call a little faster, as NCCL's own can.)"""
    assume(nodes * devices >= 2)
    c = Cluster(instance(devices=devices, nic_gbps=50, port_GBps=20, shared_GBps=30), nodes)
    if backend == "gloo":
        t1 = simulate_collective(c, op, size, backend=backend).time_s
        t2 = simulate_collective(c, op, size + more, backend=backend).time_s
    else:
        t1, t2 = _link_model(c, op, size), _link_model(c, op, size + more)
    assert t2 >= t1 * (1 - 1e-9)


def test_auto_follows_nccls_tuner_and_mics_only_under_sagemaker():
    """`auto` on NCCL is what NCCL's tuner picks (nccl_model.choose on the system the topology
    implies): over 64 nodes a 1 MB all-reduce goes by tree (latency log2 of the nodes against
    ring's ranks); the hierarchical all-gather only under SageMaker's library (`mics`)."""
    from shardsim.simulator.network import nccl_model as nm
    from shardsim.simulator.network.collectives import Algo, GroupLayout, algo_for
    from shardsim.simulator.network.links import build_links
    from shardsim.simulator.network.nccl_runs import Shape, nccl_system
    from shardsim.specs.hardware.topology import Cluster, load_instance

    cluster = Cluster(load_instance("p4d.24xlarge"), 64)
    g = build_links(cluster)
    world = GroupLayout(0, cluster.world, cluster.world)
    for size in (8, 1e6, 1e9):
        picked = algo_for("all_reduce", "auto", world, 8, "nccl", g, size)
        tuner = nm.choose("all_reduce", int(size), nccl_system(cluster, Shape(512, 64)))
        assert (picked.name, picked.proto) == (tuner.algo, tuner.proto)
    assert algo_for("all_reduce", "auto", world, 8, "nccl", g, 1e6).name == "tree"
    assert algo_for("all_reduce", "auto", world, 8, "gloo", g, 1e6) == Algo("ring")  # gloo: rings only
    assert algo_for("all_gather", "auto", world, 8, "nccl", g, 1e6).name == "ring"  # FSDP2: flat NCCL
    assert algo_for("all_gather", "auto", world, 8, "nccl", g, 1e6, mics=True) == Algo("hierarchical", "Simple")
    one_node = GroupLayout(0, 8, 8)
    assert algo_for("all_gather", "auto", one_node, 8, "nccl", g, 1e6, mics=True).name == "ring"  # within a node
    assert algo_for("all_gather", "ring", world, 8, "nccl", g, 1e6, proto="LL") == Algo("ring", "LL")  # forced


def test_the_command_offers_every_collective_the_simulator_times():
    """`shardsim collective --op` lists its choices without importing simpy: the same tuple."""
    from shardsim.cli.collective import OPS as offered
    from shardsim.simulator.collective import OPS as timed

    assert offered == timed
