"""InfiniBand NICs: their own figures, not EFA's (DGX nodes: EDR on DGX-1, HDR on DGX A100, NDR on DGX H100)."""

from __future__ import annotations

import pytest

from shardsim.simulator.network.collectives import GroupLayout, call_alone_s
from shardsim.simulator.network.links import links_for
from shardsim.specs.hardware.topology import load_instance, make_cluster


def test_dgx_a100_has_eight_hdr_hcas_without_efas_size_factor():
    nic = load_instance("dgx-a100").nic
    assert (nic.fabric, nic.count, nic.rate_gbps, nic.gpudirect_rdma) == ("infiniband", 8, 200.0, True)
    efa = load_instance("p4de.24xlarge").nic.figures
    assert nic.figures.factor(64 * 2**10) == 1.0 and efa.factor(64 * 2**10) < 0.5


@pytest.mark.parametrize("nbytes", [2**20, 2**30])
def test_an_all_reduce_across_dgx_a100_nodes_moves_at_the_hcas_rate(nbytes):
    times = {}
    for name in ("dgx-a100", "p4de.24xlarge"):  # the same HGX A100 80 GB board, IB HDR against EFA
        g = links_for(make_cluster(name, 2))
        times[name] = call_alone_s(g, "all_reduce", GroupLayout(0, 16, 16), nbytes, "ring", "nccl")
    # 8 x 200 Gb/s against 4 x 100 Gb/s (4 x the rate; at 1 MiB NCCL's latency is a share of both)
    assert times["p4de.24xlarge"] / times["dgx-a100"] > 3.0


def test_each_infiniband_generation_has_its_rate_and_the_dgx_1_shares_a_port_between_two_gpus():
    nics = {name: load_instance(name).nic for name in ("dgx-1-v100", "dgx-a100", "dgx-h100")}
    assert [(n.generation, n.rate_gbps, n.count) for n in nics.values()] == [
        ("InfiniBand EDR", 100.0, 4),
        ("InfiniBand HDR", 200.0, 8),
        ("InfiniBand NDR", 400.0, 8),
    ]
    assert all(n.fabric == "infiniband" and n.figures.factor(2**16) == 1.0 for n in nics.values())
    # 1 GiB across two nodes: NDR's 8 ports at twice HDR's rate; the DGX-1's 4 EDR ports a quarter of HDR's 8
    g = {name: links_for(make_cluster(name, 2)) for name in nics}
    t = {name: call_alone_s(g[name], "all_reduce", GroupLayout(0, 16, 16), 2**30, "ring", "nccl") for name in nics}
    assert 1.8 < t["dgx-a100"] / t["dgx-h100"] < 2.05 and t["dgx-1-v100"] > 3.5 * t["dgx-a100"]
