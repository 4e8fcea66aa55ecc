"""NCCL's rings over an NVLink mesh (V100's hybrid cube-mesh): which rings, at what speed, and the
collectives of a group of GPUs on p3dn.24xlarge at the share of its rings."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardsim.core.errors import ConfigError
from shardsim.simulator.network.collectives import GroupLayout, call_alone_s
from shardsim.simulator.network.links import links_for
from shardsim.simulator.network.nvlink_mesh import PCI_GBPS, nccl_rings, ring_share
from shardsim.specs.hardware.topology import builtin_topology_dir, load_instance, make_cluster, parse_instance

P3DN = load_instance("p3dn.24xlarge")
MESH = P3DN.fabric.nvlink_mesh
V100_LINK = 20.0  # NCCL's topo.h SM70_NVLINK_BW


def _links(gpus: tuple[int, ...]) -> dict[tuple[int, int], int]:
    return {(a, b): n for a, b, n in MESH if a in gpus and b in gpus} | {
        (b, a): n for a, b, n in MESH if a in gpus and b in gpus
    }


def test_p3dn_gives_the_dgx1_hybrid_cube_mesh():
    assert len(MESH) == 16  # two fully linked quads (6 pairs each) and 4 cross links
    for g in range(8):
        assert sum(n for a, b, n in MESH if g in (a, b)) == 6  # the V100's 6 NVLinks
    assert {(a, b) for a, b, _ in MESH if a < 4 <= b} == {(0, 4), (1, 5), (2, 6), (3, 7)}


def test_all_eight_gpus_ring_over_every_link():
    rings = nccl_rings(MESH, tuple(range(8)), V100_LINK)
    assert rings.path == "NVL" and len(rings.rings) == 6 and rings.speed_GBps == 20.0
    assert ring_share(MESH, tuple(range(8)), V100_LINK) == 1.0


@pytest.mark.parametrize(
    ("gpus", "channels", "total", "path"),
    [
        ((0, 1), 1, 20.0, "NVL"),  # one NVLink
        ((2, 3), 2, 40.0, "NVL"),  # two: one ring at 40 GB/s, doubled at 20 (ncclTopoDupChannels)
        ((0, 1, 2, 3), 4, 80.0, "NVL"),  # a quad: 4 of its GPUs' 6 links
        ((0, 2, 4, 6), 2, 40.0, "NVL"),
        ((0, 1, 5), 1, 20.0, "NVB"),  # 5 -> 0 only through GPU 1
        ((0, 5), 1, PCI_GBPS, "PCI"),  # not linked, nobody between: PCIe through the host
        ((0, 1, 6, 7), 1, PCI_GBPS, "PCI"),
    ],
)
def test_rings_of_a_subset(gpus, channels, total, path):
    rings = nccl_rings(MESH, gpus, V100_LINK)
    assert (len(rings.rings), rings.total_GBps, rings.path) == (channels, total, path)


@settings(max_examples=15, derandomize=True, deadline=None)
@given(st.sets(st.integers(0, 7), min_size=2, max_size=8))
def test_rings_visit_the_set_and_fit_its_links(gpus):
    gpus = tuple(sorted(gpus))
    rings = nccl_rings(MESH, gpus, V100_LINK)
    assume(rings.path == "NVL")
    load: dict[tuple[int, int], float] = {}
    for ring in rings.rings:
        assert sorted(ring) == list(gpus)
        for a, b in zip(ring, (*ring[1:], ring[0]), strict=True):
            load[a, b] = load.get((a, b), 0.0) + rings.speed_GBps
    links = _links(gpus)
    assert all(used <= links[edge] * V100_LINK + 1e-9 for edge, used in load.items())
    assert 0 < ring_share(MESH, gpus, V100_LINK) <= 1.0


def test_a_collective_runs_at_its_groups_share_of_the_port():
    g = links_for(make_cluster(P3DN, 1))
    busbw = {}
    for n in (4, 8):
        t = call_alone_s(g, "all_gather", GroupLayout(0, 8, n), 2**30, "ring", "nccl")
        busbw[n] = 2**30 * (n - 1) / n / t
    assert busbw[8] / busbw[4] == pytest.approx(120 / 80, rel=0.02)  # the rings' totals, in NCCL's GB/s
    half = links_for(make_cluster(P3DN, 1, gpus_per_node=4))  # GPUs 0-3: the quad's rings, not the board's
    t = call_alone_s(half, "all_gather", GroupLayout(0, 4, 4), 2**30, "ring", "nccl")
    assert 2**30 * 3 / 4 / t == pytest.approx(busbw[4], rel=0.01)


def _p3dn_raw() -> dict:
    return yaml.safe_load((builtin_topology_dir() / "p3dn.24xlarge.yaml").read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.update(kind="nvswitch"), "an nvlink fabric's"),
        (lambda f: f["nvlink_mesh"]["value"].append([1, 0, 1]), "listed twice"),
        (lambda f: f["nvlink_mesh"]["value"].__setitem__(0, [0, 8, 1]), "GPUs are 0 to 7"),
        (lambda f: f["nvlink_mesh"]["value"].pop(), "same number of NVLinks"),
        (lambda f: f["nvlink_mesh"].update(value="cube"), "triples"),
    ],
)
def test_a_bad_mesh_is_one_clear_error(change, message):
    raw = copy.deepcopy(_p3dn_raw())
    change(raw["fabric"])
    with pytest.raises(ConfigError, match=message) as err:
        parse_instance(raw, "p3dn.yaml")
    assert "fabric.nvlink_mesh" in str(err.value)


def test_a_send_runs_on_its_pairs_links():
    g = links_for(make_cluster(P3DN, 1))
    one = call_alone_s(g, "send_recv", GroupLayout(0, 2, 2), 2**30, "ring", "nccl")  # GPUs 0 and 1: one NVLink
    two = call_alone_s(g, "send_recv", GroupLayout(2, 2, 2), 2**30, "ring", "nccl")  # GPUs 2 and 3: two
    assert one / two == pytest.approx(2.0, rel=0.01)
