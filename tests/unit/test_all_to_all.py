"""All-to-all as NCCL and gloo run it: point-to-point sends on the links (inside a node over the
NVSwitch, across nodes on the NICs' rails, PXN), uneven exchanges, the plan's op in the engine,
and `shardsim collective --op all_to_all` (with --compare) and `calibrate` on alltoall_perf output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardsim.cli import main
from shardsim.core.errors import ConfigError
from shardsim.simulator.collective import nccl_tests_row, simulate_collective
from shardsim.simulator.engine import chain_bound, simulate
from shardsim.simulator.network.alltoall import Exchange, pxn
from shardsim.simulator.network.collectives import GroupLayout, all_to_all_v_s, call_alone_s
from shardsim.simulator.network.links import links_for
from shardsim.simulator.plan import Plan, RankClass
from shardsim.specs.hardware.topology import make_cluster
from tests.helpers import one_tier

ROOT = Path(__file__).resolve().parents[2]
A2A_FILE = str(ROOT / "tests/fixtures/alltoall_perf-synthetic-2x8.txt")
GIB = float(1 << 30)


def _a2a(topology: str, nodes: int, size: float = GIB, **kw):
    return simulate_collective(make_cluster(topology, nodes), "all_to_all", int(size), **kw)


def test_one_node_runs_at_the_nvswitch_ports() -> None:
    """8 x H100: each rank sends 7/8 of S through its NVSwitch port at 450 GB/s x 0.8222 = 370 GB/s,
    so busbw = S/t x 7/8 is the port's rate, less the call's latency (8.4 + 3.4 us: NCCL's base and
    one NVLink hop, Simple)."""
    r = _a2a("p5.48xlarge", 1)
    port = 450e9 * 0.8222
    assert r.time_s == pytest.approx(7 / 8 * GIB / port + 11.8e-6, rel=1e-9)
    assert (r.algo, r.protocol, r.ranks) == ("p2p", "Simple", 8)
    assert r.busbw_GBps == pytest.approx(r.algbw_GBps * 7 / 8)


def test_two_p5_nodes_are_bound_by_the_nics_a_hand_computed_figure() -> None:
    """2 x p5.48xlarge, 16 ranks, 1 GiB: each rank sends 8/16 of S to the other node, 4 GiB a node
    over 32 EFA of 100 Gbps x 0.98 = 392 GB/s; each NIC carries 128 MiB, at which EFA's fitted
    size factor is 0.785 (halfway in log bytes from 0.57 at 16 MiB to 1 at 1 GiB); latency 8.4 us
    (base) + 14 us (a network hop) + 2 x 24 us (EFA's latencyInter, twice for Simple):
    4 GiB / (392 GB/s x 0.785) + 70.4 us = 14.028 ms, busbw 71.76 GB/s."""
    cluster = make_cluster("p5.48xlarge", 2)
    assert cluster.instance.nic.figures.factor(GIB / 8) == pytest.approx(0.785)
    r = simulate_collective(cluster, "all_to_all", int(GIB))
    assert r.time_s == pytest.approx(4 * GIB / (392e9 * 0.785) + 70.4e-6, rel=1e-9)
    assert r.time_s == pytest.approx(14.028e-3, abs=1e-6)
    assert r.busbw_GBps == pytest.approx(GIB / r.time_s / 1e9 * 15 / 16)
    assert r.time_s > 5 * _a2a("p5.48xlarge", 1).time_s  # across nodes the NICs, not NVLink, set the pace


def test_bus_factor_and_nccl_tests_columns() -> None:
    """busbw = algbw x (n-1)/n (nccl-tests doc/PERFORMANCE.md); alltoall_perf's count is per peer."""
    for topology, nodes in (("p5.48xlarge", 2), ("p4d.24xlarge", 2), ("g4dn.12xlarge", 1)):
        r = _a2a(topology, nodes, 1 << 24)
        n = r.ranks
        assert r.busbw_GBps == pytest.approx(r.algbw_GBps * (n - 1) / n)
        row = nccl_tests_row(r)
        assert (row["count"], row["redop"], row["root"]) == ((1 << 24) // 4 // n, "none", -1)


def test_nccl_sends_small_messages_by_ll() -> None:
    """LL for a send of at most 16 KiB (NCCL_P2P_LL_THRESHOLD), Simple above."""
    assert _a2a("p5.48xlarge", 2, 16 * 16384).protocol == "LL"
    assert _a2a("p5.48xlarge", 2, 16 * 16384 + 16).protocol == "Simple"


def test_pxn_puts_a_remote_send_on_the_receivers_rail() -> None:
    """NCCL's PXN (p5: NVSwitch, GPUDirect RDMA, 4 NICs a GPU): rank 0 sending to local GPU 3 of the
    other node goes over NVLink to GPU 3 and out on its NICs 12-15; without PXN on its own 0-3; the
    receiver takes it on its own rail either way. g4dn (PCIe) has no PXN."""
    g = links_for(make_cluster("p5.48xlarge", 2))
    assert pxn(g) and not pxn(links_for(make_cluster("g4dn.12xlarge", 2)))
    names = {
        on: {g.names[i] for i in g.p2p_loads(np.array([0]), np.array([11]), np.array([1.0]), on)[0]} for on in (1, 0)
    }
    rx = {f"nic_rx[{32 + j}]" for j in range(12, 16)}
    assert names[1] == {"port_tx[0]", "port_rx[3]"} | {f"nic_tx[{j}]" for j in range(12, 16)} | rx
    assert names[0] == {f"nic_tx[{j}]" for j in range(4)} | rx


def test_the_busiest_rank_receives_its_factor() -> None:
    ex = Exchange.busiest(8, 3.0, rank=2)
    w = ex.matrix()
    assert w.sum(axis=1) == pytest.approx(np.ones(8))
    received = w.sum(axis=0)
    assert received[2] == pytest.approx(3.0) and received.sum() == pytest.approx(8.0)
    assert ex.transposed().matrix().sum(axis=1)[2] == pytest.approx(3.0)  # the combine: it sends as much
    again, mean = Exchange.of_bytes(w * 1000.0)
    assert mean == pytest.approx(1000.0) and again.matrix() == pytest.approx(w)
    with pytest.raises(ConfigError, match="from 1 to the group's 8 ranks"):
        Exchange.busiest(8, 9.0)
    for bad in ([[1, 2]], [[0]], [[1, -1], [0, 1]]):
        with pytest.raises(ConfigError, match="per-peer bytes"):
            Exchange.of_bytes(bad)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    topology=st.sampled_from(["p5.48xlarge", "p4d.24xlarge", "g4dn.12xlarge"]),
    nodes=st.integers(1, 3),
    factor=st.floats(1.05, 4.0),
    size=st.sampled_from([1 << 22, 1 << 26, 1 << 30]),
    backend=st.sampled_from(["nccl", "gloo"]),
)
def test_uneven_bytes_are_slower_than_even(topology, nodes, factor, size, backend) -> None:
    """The same mean bytes, one rank receiving `factor` times the mean: its links carry more, the
    call waits for them (a pure function of layout, bytes and exchange; more skew never faster).
    Not on one g4dn node: every byte crosses its shared PCIe host bridge whatever the skew."""
    assume(topology != "g4dn.12xlarge" or nodes > 1)
    cluster = make_cluster(topology, nodes)
    g, n = links_for(cluster), cluster.world
    assume(factor + 0.5 <= n)
    layout = GroupLayout.world(n)
    even = call_alone_s(g, "all_to_all", layout, size, "auto", backend)
    uneven = call_alone_s(g, "all_to_all", layout, size, "auto", backend, exchange=Exchange.busiest(n, factor))
    worse = call_alone_s(g, "all_to_all", layout, size, "auto", backend, exchange=Exchange.busiest(n, factor + 0.5))
    assert even < uneven <= worse * (1 + 1e-12)
    counts = Exchange.busiest(n, factor).matrix() * size
    assert all_to_all_v_s(g, layout, counts, backend) == pytest.approx(uneven, rel=1e-9)
    assert all_to_all_v_s(g, layout, np.full((n, n), size / n), backend) == pytest.approx(even, rel=1e-9)


def test_gloo_sends_pairwise_at_the_links_rate() -> None:
    """gloo (pairwise sends all posted at once): n ranks of one a node each send (n-1)/n of S
    through their NIC, after one hop's latency."""
    c = one_tier(4, 100.0, 5.0)
    r = simulate_collective(c, "all_to_all", int(1e9), backend="gloo")
    assert (r.algo, r.protocol) == ("pairwise", "")
    assert r.time_s == pytest.approx(5e-6 + 0.75e9 / (100e9 / 8), rel=1e-9)


def _plan(layout: GroupLayout, nbytes: float, other: tuple[str, float] | None = None, exchange=None) -> Plan:
    """One rank class over the world: an all-to-all, and beside it (its own stream) `other`."""
    p = Plan(classes=[RankClass("all", 0, layout.count, 0.0, 0.0, ())])
    p.all_to_all(0, "a2a", layout, nbytes, "dispatch", [], "fwd", exchange)
    if other:
        p.comm(0, "other", other[0], layout, other[1], other[0], [], "fwd")
    return p


def test_an_all_to_all_op_takes_the_collective_models_time_and_shares_the_nics() -> None:
    """A hand-built plan on 2 x p5: alone, the op lasts what `call_alone_s` (and `shardsim
    collective`) says; beside an all-gather over the same ranks both load the same NICs, so the
    all-to-all ends later, and the pair takes no less than the busier one alone."""
    cluster = make_cluster("p5.48xlarge", 2)
    g = links_for(cluster)
    world = GroupLayout.world(cluster.world)
    alone = call_alone_s(g, "all_to_all", world, GIB, "auto", "nccl")
    assert alone == pytest.approx(simulate_collective(cluster, "all_to_all", int(GIB)).time_s, rel=1e-9)
    (span,) = simulate(_plan(world, GIB), g, "auto", "nccl")
    assert span.end - span.start == pytest.approx(alone, rel=1e-9)
    gather = call_alone_s(g, "all_gather", world, 4 * GIB, "auto", "nccl")
    both = _plan(world, GIB, ("all_gather", 4 * GIB))
    a2a, ag = simulate(both, g, "auto", "nccl")
    assert a2a.end > 1.2 * alone and ag.end > 1.05 * gather
    assert max(a2a.end, ag.end) >= max(alone, gather) and max(a2a.end, ag.end) >= chain_bound(both, g, "auto", "nccl")


def test_an_uneven_op_in_a_plan_waits_for_its_busiest_rank() -> None:
    cluster = make_cluster("p5.48xlarge", 2)
    g = links_for(cluster)
    world = GroupLayout.world(cluster.world)
    ex = Exchange.busiest(16, 2.0)
    (span,) = simulate(_plan(world, GIB, exchange=ex), g, "auto", "nccl")
    assert span.end == pytest.approx(call_alone_s(g, "all_to_all", world, GIB, "auto", "nccl", exchange=ex))
    assert span.end > 1.5 * call_alone_s(g, "all_to_all", world, GIB, "auto", "nccl")


def _cli(capsys, *argv: str) -> dict:
    assert main(["collective", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_command_times_all_to_all_and_compares_alltoall_perf(capsys) -> None:
    doc = _cli(capsys, "--op", "all_to_all", "--topology", "p5.48xlarge", "--nodes", "2")
    assert (doc["op"], doc["ranks"], doc["algo"], doc["protocol"]) == ("all_to_all", 16, "p2p", "Simple")
    assert doc["busbw_GBps"] == pytest.approx(71.76, abs=0.01)
    uneven = _cli(capsys, "--op", "all_to_all", "--topology", "p5.48xlarge", "--nodes", "2", "--imbalance", "2")
    assert uneven["time_s"] > 1.5 * doc["time_s"]
    cmp = _cli(capsys, "--compare", A2A_FILE, "--topology", "p5.48xlarge")
    assert (cmp["op"], cmp["ranks"], cmp["summary"]["sizes"]) == ("all_to_all", 16, 8)
    last = cmp["rows"][-1]
    assert last["size_bytes"] == 1 << 30 and last["measured_busbw_GBps"] == 56.12
    assert last["predicted_busbw_GBps"] == pytest.approx(doc["busbw_GBps"])
    assert [r["protocol"] for r in cmp["rows"][:3]] == ["LL", "LL", "Simple"]


def test_calibrate_reads_alltoall_perf(tmp_path, capsys) -> None:
    out = tmp_path / "a2a.yaml"
    argv = ["calibrate", "--nccl-tests", A2A_FILE, "--topology", "p5.48xlarge", "--params", "latency_inter_us"]
    assert main([*argv, "--folds", "0", "--out", str(out)]) == 0, capsys.readouterr().err
    assert "all_to_all" in out.read_text()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--op", "all_to_all", "--algo", "ring"], "point-to-point sends to every peer (p2p on nccl), not ring"),
        (["--op", "all_to_all", "--protocol", "LL128"], "LL or Simple, not LL128"),
        (["--op", "all_to_all", "--backend", "gloo", "--protocol", "LL"], "gloo has none"),
        (["--op", "all_to_all", "--imbalance", "17"], "from 1 to the group's 16 ranks, not 17"),
        (["--op", "all_reduce", "--imbalance", "2"], "not all_reduce's"),
        (["--compare", A2A_FILE, "--imbalance", "2"], "nccl-tests' even ones"),
    ],
)
def test_refusals_are_one_line_exit_2(capsys, argv, says) -> None:
    assert main(["collective", "--topology", "p5.48xlarge", "--nodes", "2", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_an_imbalance_below_one_is_refused_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["collective", "--op", "all_to_all", "--imbalance", "0.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--imbalance: expected a finite number >= 1" in err[0], err
