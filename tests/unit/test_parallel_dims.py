"""ParallelDims: every dimension's groups partition the world, coordinates round-trip, and the
layout agrees with the simulator's groups (`StageMesh`) and a row-major DeviceMesh."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardsim.simulator.strategies.mesh import StageMesh
from shardsim.spec.parallel_dims import DIMENSIONS, ORDERS, ParallelDims

SIZES = st.sampled_from([1, 2, 3, 4])
DIMS = st.builds(
    ParallelDims,
    pp=SIZES,
    dp_replicate=SIZES,
    dp_shard=SIZES,
    cp=st.sampled_from([1, 2]),
    ep=st.sampled_from([1, 2]),
    tp=SIZES,
    mesh_order=st.sampled_from(sorted(ORDERS)),
)
NAMES = st.lists(st.sampled_from(DIMENSIONS), min_size=1, max_size=3, unique=True)
CHECKS = settings(derandomize=True, database=None, max_examples=150, deadline=None)


@CHECKS
@given(DIMS, NAMES)
def test_groups_partition_the_world(dims, names):
    groups = dims.groups(*names)
    ranks = sorted(r for g in groups for r in g)
    assert ranks == list(range(dims.world))
    assert {len(g) for g in groups} == {int(np.prod([dims.size(n) for n in names]))}
    for g in groups:
        for r in g:
            assert dims.group(r, *names) == g


@CHECKS
@given(DIMS, st.data())
def test_coordinates_round_trip(dims, data):
    rank = data.draw(st.integers(0, dims.world - 1))
    c = dims.coords(rank)
    assert dims.rank(c) == rank
    assert all(0 <= c[d] < dims.size(d) for d in DIMENSIONS)
    # a group in one dimension: its members differ from `rank` there only, `stride` apart
    for d in DIMENSIONS:
        g = dims.group(rank, d)
        assert [dims.coords(r)[d] for r in g] == list(range(dims.size(d)))
        rest = {k: v for k, v in c.items() if k != d}
        assert all({k: v for k, v in dims.coords(r).items() if k != d} == rest for r in g)
        assert all(b - a == dims.stride(d) for a, b in zip(g, g[1:], strict=False))


@CHECKS
@given(DIMS)
def test_mesh_is_row_major_over_the_world(dims):
    shape, names = dims.mesh()
    mesh = np.arange(dims.world).reshape(shape or (1,))
    for rank in range(dims.world):
        c = dims.coords(rank)
        assert mesh[tuple(c[n] for n in names)] == rank
    assert set(names) == {d for d in DIMENSIONS if dims.size(d) > 1}
    assert dims.mesh("tp")[1].count("tp") == 1


@CHECKS
@given(DIMS, st.sampled_from(DIMENSIONS), st.sampled_from([1, 2, 4, 8]))
def test_a_group_within_a_node(dims, name, per_node):
    assume(dims.world % per_node == 0)
    span = (dims.size(name) - 1) * dims.stride(name) + 1  # first to last rank of a group
    aligned = per_node % (dims.size(name) * dims.stride(name)) == 0
    assert dims.within_node(per_node, name) == (dims.size(name) == 1 or aligned)
    if span > per_node:
        assert not dims.within_node(per_node, name)


def test_mesh_orders_place_tp_innermost_or_next_to_pp():
    inner = ParallelDims(pp=2, dp_shard=2, tp=2)
    outer = inner.replace(mesh_order="pp,tp,dp")
    assert inner.group(0, "tp") == (0, 1) and inner.group(0, "dp_shard") == (0, 2)
    assert outer.group(0, "tp") == (0, 2) and outer.group(0, "dp_shard") == (0, 1)
    assert inner.tp_inner and not outer.tp_inner
    assert inner.mesh() == ((2, 2, 2), ("pp", "dp_shard", "tp"))
    assert outer.mesh("dp_replicate") == ((2, 2, 1, 2), ("pp", "tp", "dp_replicate", "dp_shard"))
    assert inner.layout == "pp2 dp_shard2 tp2" and ParallelDims().layout == "1"
    assert inner.label() == " tp=2" and ParallelDims(pp=4).label() == ""


@pytest.mark.parametrize("bad", [{"tp": 0}, {"pp": -1}, {"mesh_order": "tp,dp,pp"}])
def test_refuses_what_is_no_mesh(bad):
    with pytest.raises(ValueError):
        ParallelDims(**bad)


@CHECKS
@given(DIMS.filter(lambda d: d.cp == d.ep == 1), st.data())
def test_the_network_groups_are_the_dims_groups(dims, data):
    """The simulator's groups of a stage (`StageMesh`, what the collectives cost) are the mesh's."""
    stage = data.draw(st.integers(0, dims.pp - 1))
    mesh = StageMesh(dims, stage)
    lo, hi = mesh.start, mesh.start + mesh.count
    for names in [("tp",), ("dp_shard",), ("dp_replicate",), ("dp_replicate", "dp_shard")]:
        want = sorted(sorted(g) for g in dims.groups(*names) if lo <= g[0] < hi)
        assert sorted(sorted(g) for g in mesh.groups(*names).groups().tolist()) == want
