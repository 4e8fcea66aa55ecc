"""The simulator's plan issues exactly the collectives PyTorch's tensor parallelism issues (kind,
size, group), alone, under FSDP2 and in a pipeline stage: DTensor's plans applied by the runtime
(`runtime.strategies.tensor_parallel`) and traced in one process under the fake process group
(`collective_trace.trace_step`)."""

from __future__ import annotations

from collections import Counter

import pytest

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.runtime.collective_trace import trace_step
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.predict import rank_workload
from shardsim.simulator.strategies.build import build_plan
from shardsim.specs.hardware.topology import Cluster
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.library import PRESETS
from tests.helpers import instance

LLAMA = Arch("llama", hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seq_len=32, vocab=256)  # GQA
GPT = PRESETS["tiny-gpt"]  # biases, learned positions, LayerNorm
BERT = Arch("bert", hidden=64, layers=2, heads=4, ffn=128, seq_len=32, vocab=256)
VIT = Arch("vit", hidden=64, layers=2, heads=4, ffn=128, image=24, patch=8, classes=10)  # 10 tokens
ROLE = {"tp": "tp", "ag": "shard", "rs": "shard", "ar": "replicate"}  # a plan's stream → the mesh dimension


def _config(arch: Arch, strategy: Strategy, checkpointing: str) -> RunConfig:
    return RunConfig(workload=arch, strategy=strategy, batch_per_device=2, checkpointing=checkpointing, backend="gloo")


def planned(cfg: RunConfig, world: int, stage: int | None = None) -> Counter:
    """(kind, elements, group size, mesh dimension) of the plan's collectives; of one pipeline
    stage's first microbatch (its tensor-parallel ones) when `stage` is given."""
    cluster = Cluster(instance(devices=world), 1)
    w = from_arch("traced", cfg.workload)
    cfg = cfg.replace(backend="nccl")  # every collective on its own stream (its mesh dimension)
    cfg, res = resolve(cfg, world, len(w.layers), arch=w.arch, devices_per_node=world)
    cm = ComputeModel(cluster.instance.device, cfg.precision, arch=w.arch, tp=res.tp)
    plan = build_plan(cfg, res, rank_workload(w, res.tp, cfg.strategy.sequence_parallel), cm)
    ops = [o for o in plan.ops if o.kind == "comm" and o.coll != "send_recv"]
    if stage is not None:
        ops = [o for o in ops if o.rank_class == stage and o.stream == "tp" and f" s{stage} m0" in o.name]
    return Counter((o.coll, round(o.nbytes / 4), o.layout.size, ROLE[o.stream]) for o in ops)  # fp32: 4 bytes


def traced(cfg: RunConfig, world: int, rank: int = 0, tp_only: bool = False) -> Counter:
    calls = trace_step(cfg, world, rank=rank, devices_per_node=world)
    roles = {"shard": "shard", "replicate": "replicate", "tp": "tp", "dp_shard": "shard", "dp_replicate": "replicate"}
    out = Counter((c.kind, c.numel, c.group_size, roles.get(c.group, c.group)) for c in calls)
    return Counter({k: n for k, n in out.items() if k[3] == "tp"}) if tp_only else out


@pytest.mark.parametrize("checkpointing", ["none", "full", "selective"])
@pytest.mark.parametrize("sp", [False, True], ids=["no-sp", "sp"])
@pytest.mark.parametrize("arch", [LLAMA, GPT, BERT, VIT], ids=["llama-gqa", "gpt", "bert", "vit"])
def test_tp_alone(arch: Arch, sp: bool, checkpointing: str) -> None:
    cfg = _config(arch, Strategy("ddp", tp=2, sequence_parallel=sp), checkpointing)
    assert planned(cfg, 2) == traced(cfg, 2)


FSDP_CASES = {
    "zero-tp2": (Strategy("zero", tp=2), 4),
    "zero-tp2-sp": (Strategy("zero", tp=2, sequence_parallel=True), 4),
    "zero2d-tp2-sp": (Strategy("zero2d", degree=2, tp=2, sequence_parallel=True), 8),
    "zero-tp4-sp": (Strategy("zero", tp=4, sequence_parallel=True), 8),
    "zero2d-tp2-dp-inner": (Strategy("zero2d", degree=2, tp=2, mesh_order="pp,tp,dp"), 8),
}


@pytest.mark.parametrize(
    ("arch", "strategy", "world"),
    [
        pytest.param(arch, *case, id=f"{name}-{case_id}")
        for name, arch in (("llama-gqa", LLAMA), ("gpt", GPT))
        for case_id, case in FSDP_CASES.items()
        if arch.kv >= case[0].tp  # the runtime refuses fewer key/value heads than tp (the simulator replicates them)
    ],
)
def test_tp_under_fsdp2(arch: Arch, strategy: Strategy, world: int) -> None:
    cfg = _config(arch, strategy, "full")
    assert planned(cfg, world) == traced(cfg, world)


@pytest.mark.parametrize(("kind", "world", "extra"), [("ddp", 2, {}), ("zero2d", 8, {"degree": 2})])
def test_tp_with_gradient_accumulation(kind: str, world: int, extra: dict) -> None:
    """Two micro-steps: every micro-step's collectives, the replica all-reduce on the last only."""
    cfg = _config(LLAMA, Strategy(kind, tp=2, sequence_parallel=True, **extra), "full").replace(grad_accum=2)
    assert planned(cfg, world) == traced(cfg, world)


@pytest.mark.parametrize("sp", [False, True], ids=["no-sp", "sp"])
@pytest.mark.parametrize("stage", [0, 1])
def test_tp_in_a_pipeline_stage(stage: int, sp: bool) -> None:
    cfg = _config(LLAMA, Strategy("pipeline", pp=2, microbatches=2, tp=2, sequence_parallel=sp), "none")
    rank = stage * 2  # stage s holds ranks [2s, 2s + 2)
    assert planned(cfg, 4, stage) == traced(cfg, 4, rank=rank, tp_only=True)


def test_the_groups_are_the_runtimes() -> None:
    """Rank 5 of tp 2 × zero2d d=2 over 8 ranks: the same tensor-parallel, shard and replica groups."""
    cfg = _config(LLAMA, Strategy("zero2d", degree=2, tp=2, sequence_parallel=True), "none")
    calls = trace_step(cfg, 8, rank=5, devices_per_node=8)
    runtime = {c.group: tuple(sorted(c.ranks)) for c in calls if c.ranks}
    cluster = Cluster(instance(devices=8), 1)
    w = from_arch("traced", LLAMA)
    cfg, res = resolve(cfg.replace(backend="nccl"), 8, len(w.layers), arch=w.arch, devices_per_node=8)
    plan = build_plan(cfg, res, rank_workload(w, 2, True), ComputeModel(cluster.instance.device, "fp32", tp=2))
    sim = {}
    for o in plan.ops:
        if o.kind == "comm":
            g = next(tuple(sorted(int(r) for r in row)) for row in o.layout.groups() if 5 in row)
            sim[ROLE[o.stream]] = g
    roles = {"dp_shard": "shard", "dp_replicate": "replicate"}
    assert {roles.get(k, k): v for k, v in runtime.items()} == sim
