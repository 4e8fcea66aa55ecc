"""Which NICs a communicator's bytes cross between nodes: those of the rails of its GPUs on each node
(two A100s share one EFA behind a PCIe switch on p4d; an H100 has four of p5's 32)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import yaml

from shardsim.core.errors import ConfigError
from shardsim.simulator.network.collectives import GroupLayout, call_alone_s
from shardsim.simulator.network.links import links_for
from shardsim.specs.hardware.topology import Cluster, builtin_topology_dir, make_cluster, parse_instance


def _nic_tx_loads(name: str, src: list[int], dst: list[int], groups: list[list[int]], rows: list[int]) -> np.ndarray:
    g = links_for(make_cluster(name, 2))
    links, load = g.edge_loads(np.array(src), np.array(dst), 1.0, (np.array(groups), np.array(rows)))
    nics = g.cluster.instance.nic.count
    out = np.zeros(nics)
    tx = (links >= g._nic_tx) & (links < g._nic_tx + nics)  # node 0's NICs
    out[links[tx] - g._nic_tx] = load[tx]
    return out


@pytest.mark.parametrize(
    ("name", "group", "expected"),
    [
        ("p4d.24xlarge", [0, 8], [1, 0, 0, 0]),  # GPU 0's PCIe switch holds NIC 0
        ("p4d.24xlarge", [1, 8], [1, 0, 0, 0]),  # and GPU 1: the pair shares it
        ("p4d.24xlarge", [6, 8], [0, 0, 0, 1]),
        ("p4d.24xlarge", [0, 2, 8], [0.5, 0.5, 0, 0]),  # two GPUs of the group on node 0: their NICs
    ],
)
def test_a_group_leaves_a_node_through_its_gpus_nics(name, group, expected):
    last = group[-2]  # the group's last GPU on node 0 sends to its first on node 1
    assert _nic_tx_loads(name, [last], [group[-1]], [group], [0]).tolist() == expected


def test_an_h100_has_four_of_p5s_nics():
    loads = _nic_tx_loads("p5.48xlarge", [3], [8], [[3, 8]], [0])
    assert np.flatnonzero(loads).tolist() == [12, 13, 14, 15] and loads.sum() == pytest.approx(1.0)


def test_a_whole_node_ring_spreads_over_every_nic():
    g = links_for(make_cluster("p4d.24xlarge", 2))
    ring = np.arange(16)[None, :]
    src, dst = ring.ravel(), np.roll(ring, -1, axis=1).ravel()
    links, load = g.edge_loads(src, dst, 1.0, (ring, np.zeros(16, np.int64)))
    nic = g.is_nic(links)
    assert np.allclose(load[nic], 0.25)  # 2 crossings (7 -> 8, 15 -> 0) over 4 NICs, tx and rx


def test_a_send_between_nodes_moves_at_one_nics_rate_on_p4d():
    p4d = make_cluster("p4d.24xlarge", 2)
    one_nic = Cluster(replace(p4d.instance, nic=replace(p4d.instance.nic, count=1, gpu_nics=None)), 2)
    stage = GroupLayout(7, 2, 2)  # a pipeline's stage 7 (node 0's GPU 7) sends to stage 8 (node 1's GPU 0)
    t = call_alone_s(links_for(p4d), "send_recv", stage, 2**30, "ring", "nccl")
    assert t == pytest.approx(call_alone_s(links_for(one_nic), "send_recv", stage, 2**30, "ring", "nccl"), rel=1e-9)


@pytest.mark.parametrize(
    "table",
    [
        [[0], [0], [1], [1], [2], [2], [3]],  # a GPU missing
        [[0], [0], [1], [1], [2], [2], [3], [4]],  # no NIC 4 on p4d
        [[0], [0], [0], [0], [1], [1], [1], [1]],  # NICs 2 and 3 on no GPU
        [[0, 2], [0, 2], [1, 3], [1, 3], [0, 2], [0, 2], [1, 3], [1, 3]],  # not consecutive
        "0,0,1,1",
    ],
)
def test_a_bad_gpu_nics_table_is_one_clear_error(table):
    raw = yaml.safe_load((builtin_topology_dir() / "p4d.24xlarge.yaml").read_text())
    raw["nic"]["gpu_nics"]["value"] = table
    with pytest.raises(ConfigError, match="one list of NIC indices per GPU") as err:
        parse_instance(raw, "p4d.yaml")
    assert err.value.field == "nic.gpu_nics"


def test_part_of_a_node_keeps_its_gpus_nics():
    half = make_cluster("p4d.24xlarge", 2, gpus_per_node=4)
    assert half.instance.nic.count == 2 and half.instance.nic.gpu_nics == ((0,), (0,), (1,), (1,))
