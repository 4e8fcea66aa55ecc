"""NCCL's path: the tuner's choice placed on the links, against physics and the calibration file."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardsim.core.errors import ConfigError
from shardsim.simulator.collective import compare_collective, simulate_collective
from shardsim.simulator.network.nccl_tests import read_nccl_tests
from shardsim.specs.hardware.topology import make_cluster

ROOT = Path(__file__).resolve().parents[2]
P5_FILE = ROOT / "experiments/calibration/data/nccl-all-reduce-p5-2node.csv"


def test_the_defaults_meet_issue_25s_bands_on_the_calibration_file() -> None:
    """Shipped figures: busbw within 15 % at every size from 1 MiB, time within 30 % below."""
    doc = compare_collective(make_cluster("p5.48xlarge", 2), read_nccl_tests(P5_FILE))
    big = [abs(r["busbw_error_pct"]) for r in doc["rows"] if r["size_bytes"] >= 1 << 20]
    small = [abs(r["time_error_pct"]) for r in doc["rows"] if r["size_bytes"] < 1 << 20]
    assert len(big) == 15 and len(small) == 17
    assert max(big) <= 15.0
    assert max(small) <= 30.0


def test_a_ring_over_two_nodes_never_beats_the_nics_and_a_tree_can() -> None:
    """A ring crosses each node boundary once per direction with 2(n-1)/n × S: its busbw is at
    most the node's NIC rate. A tree sends S per node: up to 2(n-1)/n times more busbw."""
    c = make_cluster("p4d.24xlarge", 2)
    nic = c.instance.nic
    node_GBps = nic.count * nic.rate_gbps / 8 * nic.efficiency
    ring = simulate_collective(c, "all_reduce", 8 << 30, algo="ring")
    tree = simulate_collective(c, "all_reduce", 8 << 30, algo="tree")
    assert ring.busbw_GBps <= node_GBps * (1 + 1e-9)
    assert tree.busbw_GBps > 1.5 * ring.busbw_GBps
    assert tree.busbw_GBps <= 2 * 15 / 16 * node_GBps * (1 + 1e-9)


def test_the_protocol_is_reported_and_can_be_forced() -> None:
    c = make_cluster("p5.48xlarge", 2)
    small = simulate_collective(c, "all_reduce", 8)
    assert (small.algo, small.protocol) == ("tree", "LL")
    big = simulate_collective(c, "all_reduce", 1 << 30)
    assert (big.algo, big.protocol) == ("nvls_tree", "Simple")  # NVLink SHARP on H100 nodes
    ll = simulate_collective(c, "all_reduce", 1 << 30, algo="ring", proto="LL")
    simple = simulate_collective(c, "all_reduce", 1 << 30, algo="ring", proto="Simple")
    assert ll.protocol == "LL" and ll.time_s > 5 * simple.time_s  # LL carries 8 of 16 bytes, capped by NCCL
    with pytest.raises(ConfigError, match="Simple protocol only"):
        simulate_collective(c, "all_reduce", 1 << 20, algo="nvls_tree", proto="LL")


def test_no_nvls_without_nvlink_sharp() -> None:
    """A100's NVSwitch has no SHARP: NCCL's tuner never offers NVLS there."""
    c = make_cluster("p4d.24xlarge", 2)
    picked = {simulate_collective(c, "all_reduce", 1 << k).algo for k in range(3, 35, 3)}
    assert picked <= {"ring", "tree"}


def test_the_fabrics_latency_enters_each_network_hop() -> None:
    """EFA's latencyInter (fitted/network.yaml) over NCCL's InfiniBand figures: a tree / LL
    all-reduce over 2 nodes crosses 2 network hops, so 8 bytes take 2 × latencyInter more than
    on the same cluster with InfiniBand's figures (none)."""
    from dataclasses import replace

    from shardsim.specs.hardware.network_figures import fitted_network_figures
    from shardsim.specs.hardware.topology import Cluster

    efa = make_cluster("p5.48xlarge", 2)
    ib_figures, _ = fitted_network_figures("infiniband")
    inst = efa.instance
    ib = Cluster(replace(inst, nic=replace(inst.nic, fabric="infiniband", figures=ib_figures)), 2)
    t_efa = simulate_collective(efa, "all_reduce", 8, algo="tree", proto="LL").time_s
    t_ib = simulate_collective(ib, "all_reduce", 8, algo="tree", proto="LL").time_s
    lat = inst.nic.figures.latency_inter_us * 1e-6
    assert t_efa - t_ib == pytest.approx(2 * lat, rel=0.02)


@pytest.mark.parametrize(
    ("topology", "nodes", "args", "needle"),
    [
        ("p4d.24xlarge", 2, ("nvls", "auto"), "no NVLink SHARP"),
        ("p5.48xlarge", 2, ("nvls", "auto"), "across nodes NCCL runs nvls_tree"),
        ("g4dn.12xlarge", 2, ("ring", "LL128"), "LL128 needs NVLink"),
    ],
)
def test_a_forced_pair_nccl_does_not_offer_is_refused_saying_why(topology, nodes, args, needle) -> None:
    algo, proto = args
    with pytest.raises(ConfigError, match=needle):
        simulate_collective(make_cluster(topology, nodes), "all_reduce", 1 << 20, algo=algo, proto=proto)
