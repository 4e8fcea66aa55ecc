"""NCCL's tuner cost model (shardsim.simulator.network.nccl_model), against hand arithmetic
from tuning.cc v2.20.3-1's constants."""

from itertools import pairwise

import pytest

from shardsim.core.errors import ConfigError
from shardsim.simulator.network import nccl_model as nm

# 2 nodes x 8 H100 (sm90), AMD hosts, 16 channels of 22 GB/s each (the p5 reading's inputs).
P5 = nm.NcclSystem(nranks=16, nnodes=2, compute_capability=90, ring=nm.Graph(16, 22.0, 22.0), cpu_vendor="amd")
ONE_NODE = nm.NcclSystem(nranks=8, nnodes=1, compute_capability=90, ring=nm.Graph(16, 22.0, 22.0))


def test_ring_ll_by_hand():
    # busBw = min(llMaxBw[AMD][2 nodes] = 22.5, 16*22/4) = 22.5; algbw = 22.5*16/30 = 12.
    # latency = 6.6 + 26*max(0.6, 2.0 AMD net overhead) + 4*2.7 = 69.4
    e = nm.tune(P5)["all_reduce", "ring", "LL"]
    assert e.bandwidth_GBps == pytest.approx(12.0)
    assert e.latency_us == pytest.approx(69.4)
    t = nm.predict_time_us("all_reduce", 8, P5)["ring", "LL"]
    assert t == pytest.approx(69.4 + 8 / (1000 * 12.0))


def test_tree_and_ring_simple_by_hand():
    table = nm.tune(P5)
    # tree: min(352*0.92, 16*41.4) * 0.5; latency 0 + 2*(7*28 + 1*28)
    tree = table["all_reduce", "tree", "Simple"]
    assert tree.bandwidth_GBps == pytest.approx(352 * 0.92 * 0.5)
    assert tree.latency_us == pytest.approx(448.0)
    # ring Simple: 352*16/30; latency 8.4 + 26*max(3.4, 3*2.0) + 4*14
    ring = table["all_reduce", "ring", "Simple"]
    assert ring.bandwidth_GBps == pytest.approx(352 * 16 / 30)
    assert ring.latency_us == pytest.approx(220.4)
    # 1 MiB: the ring plateau factor 1.4 applies (1 MiB / (16*16) >= 64)
    t = nm.predict_time_us("all_reduce", 1 << 20, P5)["ring", "Simple"]
    assert t == pytest.approx(220.4 * 1.4 + (1 << 20) / (1000 * 352 * 16 / 30))
    # tree LL128 at 64 KiB: log2(64 KiB / 64) = 10 -> correction 0.6
    bw = min(352 * 0.92 * 120 / 128, 16 * 36.7) * 0.5
    t = nm.predict_time_us("all_reduce", 1 << 16, P5)["tree", "LL128"]
    assert t == pytest.approx(14.0 + 2 * (7 * 1.25 + 8.5) + (1 << 16) / (1000 * bw * 0.6))


def test_time_grows_with_size():
    sizes = [1 << k for k in range(3, 35)]
    for (algo, proto), _ in nm.predict_time_us("all_reduce", 8, P5).items():
        times = [nm.predict_time_us("all_reduce", s, P5)[algo, proto] for s in sizes]
        assert all(b >= a for a, b in pairwise(times)), (algo, proto)
    chosen = [nm.choose("all_reduce", s, P5).time_us for s in sizes]
    assert all(b >= a for a, b in pairwise(chosen))


def test_protocol_switches_ll_to_ll128_to_simple_with_size():
    protos = [nm.choose("all_reduce", 1 << k, P5).proto for k in range(3, 35)]
    assert protos[0] == "LL"
    assert protos[-1] == "Simple"
    assert "LL128" in protos
    # once left, a protocol does not come back: LL..., LL128..., Simple...
    order = [p for i, p in enumerate(protos) if i == 0 or protos[i - 1] != p]
    assert order == ["LL", "LL128", "Simple"]


def test_tree_for_small_ring_for_large_on_two_nodes():
    assert nm.choose("all_reduce", 8, P5).algo == "tree"
    assert nm.choose("all_reduce", 16 << 30, P5).algo == "ring"
    # all-gather has no tree in NCCL 2.20: ring only without NVLS
    assert {a for a, _ in nm.predict_time_us("all_gather", 1 << 20, P5)} == {"ring"}


def test_one_node_latency_is_nvlink():
    e = nm.tune(ONE_NODE)["all_reduce", "ring", "LL"]
    # 6.6 + 14 steps * 0.6 (no network overhead on one node); LL on 1 node: Hopper cap 87.7
    assert e.latency_us == pytest.approx(6.6 + 14 * 0.6)
    assert e.bandwidth_GBps == pytest.approx(min(87.7, 352 / 4) * 8 / 14)


def test_enable_rules():
    # LL128 only on sm70/80/90 with NVLink paths; CollNet off; NVLS off across nodes
    pre_volta = nm.NcclSystem(nranks=16, nnodes=2, compute_capability=60, ring=nm.Graph(4, 10, 10))
    assert ("ring", "LL128") not in nm.predict_time_us("all_reduce", 1 << 20, pre_volta)
    pcie = nm.NcclSystem(nranks=16, nnodes=2, compute_capability=80, ring=nm.Graph(4, 10, 10, ll128_paths_ok=False))
    assert ("ring", "LL128") not in nm.predict_time_us("all_reduce", 1 << 20, pcie)
    assert ("ring", "LL128") in nm.predict_time_us("all_reduce", 1 << 20, P5)
    with_nvls = nm.NcclSystem(
        nranks=16, nnodes=2, compute_capability=90, ring=nm.Graph(16, 22, 22), nvls=nm.Graph(16, 40, 40)
    )
    algos = {a for a, _ in nm.predict_time_us("all_reduce", 1 << 20, with_nvls)}
    assert "nvls_tree" in algos and "nvls" not in algos
    assert not algos & {"collnet_direct", "collnet_chain"}


def test_bad_input():
    with pytest.raises(ConfigError):
        nm.NcclSystem(nranks=15, nnodes=2, compute_capability=90, ring=nm.Graph(16, 22, 22))
    with pytest.raises(ConfigError):
        nm.predict_time_us("all_to_all", 8, P5)
