"""ParallelDims: every dimension's groups partition the world, coordinates round-trip, and the
layout agrees with the simulator's groups (`StageMesh`) and a row-major DeviceMesh."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardsim.config import RunConfig, load_config, resolve
from shardsim.simulator.strategies.mesh import StageMesh, pipeline_ends
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.parallel_dims import DIMENSIONS, ORDERS, ParallelDims

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
    assert inner.layout == "2 × 2 × 2(2)" and ParallelDims(cp=2).layout == "1 × 1 × 1(1) × cp 2"
    assert inner.spelled == "tp 2 x pp 2 x dp 2, sharded over 2"
    assert ParallelDims.of_world(16, tp=2, dp_shard=2) == ParallelDims(dp_replicate=4, dp_shard=2, tp=2)
    assert inner.label() == " tp=2" and ParallelDims(pp=4).label() == ""


@pytest.mark.parametrize("bad", [{"tp": 0}, {"pp": -1}, {"mesh_order": "tp,dp,pp"}])
def test_refuses_what_is_no_mesh(bad):
    with pytest.raises(ValueError):
        ParallelDims(**bad)
    with pytest.raises(ValueError, match="tp 3 does not divide 8 ranks"):
        ParallelDims.of_world(8, tp=3)


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
    pp = dims.groups("pp")  # a pipeline's sends pair each rank with its peer of the next stage
    if stage + 1 < dims.pp:
        assert sorted(mesh.sends().groups().tolist()) == sorted([g[stage], g[stage + 1]] for g in pp)
    if stage > 0:
        assert sorted(mesh.sends(backward=True).groups().tolist()) == sorted([g[stage], g[stage - 1]] for g in pp)
    assert sorted(pipeline_ends(dims).groups().tolist()) == sorted([g[0], g[-1]] for g in pp)


def _dims(cfg: RunConfig, world: int = 16, per_node: int = 8) -> ParallelDims:
    w = load_workload(cfg.workload, cfg.shape, cfg.source)
    _, res = resolve(cfg, world, len(w.layers), arch=w.arch, devices_per_node=per_node)
    return res.dims


def _file(tmp_path, text: str) -> RunConfig:
    path = tmp_path / "c.yaml"
    path.write_text("workload: llama-3.1-8b\n" + text)
    return load_config(path)


def test_every_way_of_saying_a_mesh_reaches_the_dims(tmp_path):
    """Flat keys, SageMaker's, FSDP's and DeepSpeed's keys are all resolved into one ParallelDims."""
    flat = _file(tmp_path, "strategy: zero2d\ndegree: 4\ntp: 2\nmesh_order: pp,tp,dp\ntp_across_nodes: true\n")
    assert _dims(flat) == ParallelDims(dp_replicate=2, dp_shard=4, tp=2, mesh_order="pp,tp,dp")
    smp = _file(
        tmp_path,
        "distribution:\n  torch_distributed: {enabled: true}\n  smdistributed:\n    modelparallel:\n"
        "      enabled: true\n      parameters: {hybrid_shard_degree: 4, tensor_parallel_degree: 2}\n",
    )
    assert _dims(smp) == ParallelDims(dp_replicate=2, dp_shard=4, tp=2)
    fsdp = _file(tmp_path, "sharding_strategy: HYBRID_SHARD\n")  # shards within a node of 8
    assert _dims(fsdp) == ParallelDims(dp_replicate=2, dp_shard=8)
    deepspeed = _file(tmp_path, "zero_optimization: {stage: 3, mics_shard_size: 4}\n")
    assert _dims(deepspeed) == ParallelDims(dp_replicate=4, dp_shard=4)
    pipe = _file(tmp_path, "strategy: pipeline\npp: 4\nmicrobatches: 4\n")
    assert _dims(pipe) == ParallelDims(pp=4, dp_replicate=4)
    assert _dims(_file(tmp_path, "strategy: ddp\n")).layout == "1 × 1 × 16(1)"
