"""The shortcuts that make a sweep fast change no result: link grouping in plain
Python, Joins in place of zero-length wait ops, one link graph per cluster."""

from __future__ import annotations

import random

import numpy as np
import pytest

from shardsim.simulator.network.fluid import Route
from shardsim.simulator.network.linkgroups import group_links
from shardsim.simulator.network.links import build_links, links_for
from shardsim.simulator.plan import Plan, _join
from shardsim.specs.hardware.topology import make_cluster


def _group_links_reference(capacity: np.ndarray, routes: list[Route]) -> tuple[np.ndarray, list[tuple]]:
    """Dense signatures (capacity, bytes on each route) ranked by numpy's row-wise unique."""
    used = sorted({link for r in routes for link in r.links})
    sig = np.zeros((len(used), len(routes) + 1))
    sig[:, 0] = capacity[used]
    for j, r in enumerate(routes):
        for link, u in zip(r.links, r.unit, strict=True):
            sig[used.index(link), j + 1] = u
    uniq, gid = np.unique(sig, axis=0, return_inverse=True)
    gid = gid.ravel()
    out = []
    for r in routes:
        first: dict[int, float] = {}
        for link, u in zip(r.links, r.unit, strict=True):
            first.setdefault(int(gid[used.index(link)]), u)
        out.append((tuple(sorted(first)), tuple(first[k] for k in sorted(first))))
    return uniq[:, 0], out


def test_group_links_merges_links_of_one_signature_in_sorted_order() -> None:
    rng = random.Random(4)
    for _ in range(200):
        n = rng.randint(1, 30)
        capacity = np.array([rng.choice([1.0, 2.0, 3.5]) for _ in range(n)])
        routes = []
        for _ in range(rng.randint(1, 5)):
            links = rng.sample(range(n), rng.randint(1, n))
            routes.append(Route(tuple(links), tuple(rng.choice([0.5, 1.0, 2.0]) for _ in links)))
        caps, got = group_links(capacity, routes)
        want_caps, want = _group_links_reference(capacity, routes)
        assert caps.tolist() == want_caps.tolist()
        assert [(r.links, r.unit) for r in got] == want


def test_join_is_its_ops_and_the_plan_waits_for_all_of_them() -> None:
    assert _join(3) == 3 and _join(3, None, None) == 3 and _join(None) is None
    assert _join(3, 5, None, (5, 7)) == (3, 5, 7)
    assert _join((3, 5), None) == (3, 5)
    p = Plan()
    a = p.add(0, "compute", "compute", "a", [], duration=1.0)
    b = p.add(0, "p2p_fwd", "comm", "b", [a])
    c = p.add(0, "compute", "compute", "c", [_join(a, b)], duration=1.0)
    assert p.ops[c].deps == [a, b]


def test_links_for_builds_one_graph_per_cluster_value() -> None:
    one, same = make_cluster("g4dn.12xlarge", 2), make_cluster("g4dn.12xlarge", 2)
    assert one is not same
    g = links_for(one)
    assert links_for(same) is g and links_for(make_cluster("g4dn.12xlarge", 4)) is not g
    assert g.capacity.tolist() == build_links(one).capacity.tolist()
    with pytest.raises(ValueError):
        g.capacity[0] = 0.0  # shared by every prediction on this cluster: read-only
