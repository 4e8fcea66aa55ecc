"""Data parallelism in the plan as PyTorch runs it.

DDP's gradient buckets as its reducer forms and launches them: in gradient-ready order, the
first at 1 MiB and the rest at 25 MiB of fp32 gradients (checked against
`torch.distributed._compute_bucket_assignment_by_size`), each all-reduce waiting for the
backward op that produced its last gradient, the last bucket's for the end of backward; with a
compression hook 2 bytes a gradient on the wire and its casts around. FSDP2's prefetch depth:
which copy-out each all-gather waits for, in forward and in backward."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.plan import Op, Plan
from shardsim.simulator.strategies.build import build_plan
from shardsim.simulator.strategies.ddp import DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, GRAD_BYTES, GradBuckets
from shardsim.simulator.strategies.fsdp import FSDP_BACKWARD_PREFETCH, FSDP_FORWARD_AG_WAITS_FOR
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.workload import Block, Workload

MIB = 1024 * 1024
# fp32 MiB per block; every block one tensor, so PyTorch's and the plan's buckets can coincide
SIZES = {"embed": 2, "head": 1, "layers": [5] * 12}


def _block(name: str, mib: float, kind: str) -> Block:
    params = int(mib * MIB) // GRAD_BYTES
    return Block(name, params, 1e9, 2e9, 0.0, 10.0, 1.0, 1.0, kind=kind, param_tensors=1)


def workload() -> Workload:
    layers = [_block(f"layer{i}", m, "layer") for i, m in enumerate(SIZES["layers"])]
    embed, head = _block("embed", SIZES["embed"], "embed"), _block("head", SIZES["head"], "head")
    return Workload("buckets", (embed, *layers, head))


def ddp_plan(reduce_dtype: str | None = None, accum: int = 1) -> Plan:
    cfg = RunConfig(topology="p4d.24xlarge", nodes=2, strategy=Strategy("ddp"), checkpointing="none",
                    reduce_dtype=reduce_dtype, grad_accum=accum)  # fmt: skip
    w = workload()
    cfg, res = resolve(cfg, 16, len(w.layers))
    cm = ComputeModel(make_cluster(cfg.topology, cfg.nodes).instance.device, cfg.precision)
    return build_plan(cfg, res, w, cm)


def torch_buckets() -> list[list[int]]:
    """PyTorch's buckets over the blocks' tensors in gradient-ready order (head, layers last
    to first, embedding), as Reducer::rebuild_buckets forms them."""
    w = workload()
    ready = [w.blocks[-1], *reversed(w.blocks[1:-1]), w.blocks[0]]
    tensors = [torch.empty(b.params, dtype=torch.float32) for b in ready]
    caps = [DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, caps, [False] * len(tensors))
    return [[ready[i].params * GRAD_BYTES for i in b] for b in buckets]


def test_bucket_sizes_equal_pytorch_reducer() -> None:
    p = ddp_plan()
    ars = [op for op in p.ops if op.coll == "all_reduce"]
    assert [op.nbytes for op in ars] == [sum(b) for b in torch_buckets()]
    assert ars[0].nbytes == DDP_FIRST_BUCKET_BYTES and max(op.nbytes for op in ars) == DDP_BUCKET_BYTES


def test_each_all_reduce_waits_for_its_last_gradient() -> None:
    p = ddp_plan()
    by_id = {op.id: op for op in p.ops}
    ars = [op for op in p.ops if op.coll == "all_reduce"]
    closing = [by_id[max(d for d in op.deps if by_id[d].kind == "compute")].name for op in ars]
    # head (1 MiB), then 5 layers of 5 MiB a bucket: layer11..7, layer6..2, then layer1, layer0, embed
    assert closing == ["B head", "B layer7", "B layer2", "B embed"]
    bwd = [op.id for op in p.ops if op.kind == "compute" and op.phase == "bwd"]
    assert by_id[bwd[-1]].name == "B embed" and bwd[-1] in ars[-1].deps  # the last: after all of backward
    opt = next(op for op in p.ops if op.kind == "optimizer")
    assert ars[-1].id in opt.deps  # ... and the step waits for it: never hidden


def test_only_the_last_micro_step_all_reduces() -> None:
    p = ddp_plan(accum=2)
    ars = [op for op in p.ops if op.coll == "all_reduce"]
    assert len(ars) == len(torch_buckets()) and all(op.name.endswith("[1]") for op in ars)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_compression_hook_halves_the_bytes_and_casts(dtype: str) -> None:
    p32, p16 = ddp_plan(), ddp_plan(dtype)
    b32 = [op.nbytes for op in p32.ops if op.coll == "all_reduce"]
    b16 = [op.nbytes for op in p16.ops if op.coll == "all_reduce"]
    assert b16 == [b / 2 for b in b32]  # the same buckets (capped in fp32 bytes), 2-byte gradients
    by_id = {op.id: op for op in p16.ops}
    for ar in (op for op in p16.ops if op.coll == "all_reduce"):
        assert any(by_id[d].name.startswith("cast bucket") for d in ar.deps)
    backs = [op for op in p16.ops if op.name.startswith("copy back")]
    assert len(backs) == len(b16) and all(op.stream == "hook" for op in backs)
    opt = next(op for op in p16.ops if op.kind == "optimizer")
    assert backs[-1].id in opt.deps


def test_a_bucket_closes_inside_a_block_larger_than_its_cap() -> None:
    p = Plan()
    op = p.add(0, "compute", "compute", "B big", [], duration=1.0)
    b = GradBuckets(p, 0, GroupLayout(0, 4, 4), "")
    b.add(60 * MIB, op)  # 1 MiB, 25 MiB, 25 MiB ready when this op ends; 9 MiB left for the next
    b.flush(op)
    assert b.sizes == [MIB, 25 * MIB, 25 * MIB, 9 * MIB]
    assert all(op in p.ops[a].deps for a in b.ops[:3])


def zero_plan_ops() -> dict[str, Op]:
    cfg = RunConfig(topology="p4d.24xlarge", nodes=2, strategy=Strategy("zero"), checkpointing="none")
    w = workload()
    cfg, res = resolve(cfg, 16, len(w.layers))
    cm = ComputeModel(make_cluster(cfg.topology, cfg.nodes).instance.device, cfg.precision)
    p = build_plan(cfg, res, w, cm)
    return {op.name: op for op in p.ops}


def _waits(ops: dict[str, Op], name: str) -> set[str]:
    by_id = {op.id: op.name for op in ops.values()}
    return {by_id[d] for d in ops[name].deps}


def test_fsdp_forward_all_gather_waits_for_the_copy_out_two_gathers_back() -> None:
    ops = zero_plan_ops()
    assert FSDP_FORWARD_AG_WAITS_FOR == 2
    assert _waits(ops, "AG layer0") == {"AG root"}  # the stream's order only
    assert _waits(ops, "AG layer1") == {"AG root", "AG layer0", "copy-out root"}
    for i in range(2, 12):
        assert _waits(ops, f"AG layer{i}") == {"AG root", f"AG layer{i - 1}", f"copy-out layer{i - 2}"}
    assert _waits(ops, "F layer5") == {"AG layer5", "copy-out layer5"}


def test_fsdp_backward_prefetches_one_layer() -> None:
    ops = zero_plan_ops()
    assert FSDP_BACKWARD_PREFETCH == 1
    assert _waits(ops, "AG' layer11") == {"F head", "AG layer11"}  # when backward starts
    for i in range(10, -1, -1):
        assert _waits(ops, f"AG' layer{i}") == {f"AG' layer{i + 1}", f"copy-out' layer{i + 1}"}
