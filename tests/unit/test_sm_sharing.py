"""SM sharing (`engine.sm_share`): with nccl, compute on a rank class runs slower by the
share of SMs NCCL's kernel holds while that class has a collective or send in flight, and only
then; with gloo, or another class's collective, compute keeps its speed."""

from __future__ import annotations

import pytest

from shardsim.simulator.engine import NCCL_SM_SHARE, simulate, sm_share
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.network.links import links_for
from shardsim.simulator.plan import Plan, RankClass
from shardsim.specs.hardware.topology import make_cluster

G = links_for(make_cluster("p4d.24xlarge", 2))
WORLD = GroupLayout.world(16)
SHARE = sm_share(G.cluster)  # NCCL's CTAs (one a channel) over the A100's SMs


def test_the_share_is_ncclss_ctas_over_the_gpus_sms() -> None:
    assert SHARE == pytest.approx(16 / 108)  # 16 channels on NVSwitch, 108 SMs on an A100
    t4 = sm_share(make_cluster("g4dn.12xlarge", 1))
    assert t4 == pytest.approx(2 / 40)  # 2 channels on PCIe, 40 SMs on a T4
    assert sm_share(make_cluster("emu-2x2")) == NCCL_SM_SHARE  # no SM count: the traced H100 share


def _plan(nbytes: float, comm_class: int = 0, gap: float = 0.0) -> Plan:
    """Class 0 computes 1 s (after `gap` s of other compute); class `comm_class` all-gathers
    `nbytes` from the start."""
    p = Plan()
    p.classes = [RankClass("a", 0, 8, 1.0, 1.0, ()), RankClass("b", 8, 8, 1.0, 1.0, ())]
    first = p.add(0, "compute", "compute", "before", [], duration=gap) if gap else None
    p.add(0, "compute", "compute", "work", [first] if gap else [], duration=1.0)
    p.add(comm_class, "comm", "comm", "gather", [], coll="all_gather", layout=WORLD, nbytes=nbytes)
    return p


def _ends(p: Plan, backend: str) -> dict[str, float]:
    return {s.name: s.end for s in simulate(p, G, "ring", backend)}


def test_compute_slows_only_while_the_collective_runs() -> None:
    short = _ends(_plan(1e8), "nccl")
    t = short["gather"]
    assert 0 < t < 1.0
    # work done by t: t x (1 - share); the rest at full speed
    assert short["work"] == pytest.approx(t + (1.0 - t * (1 - SHARE)))
    long = _ends(_plan(1e11), "nccl")
    assert long["gather"] > 1.0 / (1 - SHARE)
    assert long["work"] == pytest.approx(1.0 / (1 - SHARE))  # slowed throughout


def test_compute_started_during_the_collective_is_slowed_from_its_start() -> None:
    ends = _ends(_plan(1e11, gap=0.5), "nccl")
    assert ends["before"] == pytest.approx(0.5 / (1 - SHARE))
    assert ends["work"] == pytest.approx(1.5 / (1 - SHARE))


def test_no_slowdown_on_gloo_or_from_another_class() -> None:
    assert _ends(_plan(1e11), "gloo")["work"] == pytest.approx(1.0)
    assert _ends(_plan(1e11, comm_class=1), "nccl")["work"] == pytest.approx(1.0)
