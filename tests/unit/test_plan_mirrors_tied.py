"""The plan's all-reduce of a tied embedding's gradient in a pipeline is the one the runtime
issues (kind, elements, group): each rank of the first and last stage with its peer of the same
data- and tensor-parallel coordinates, over its shard (vocabulary-parallel rows under TP, FSDP2's
dim-0 shard of those on sharded stages), traced in one process under the fake process group
(`collective_trace.trace_step`, `runtime.strategies.pipeline.TiedEmbedding`). The plan sizes
every rank's sum by the largest shard (the first's: `torch.chunk`'s split of an uneven vocabulary)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.runtime.collective_trace import trace_step
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.predict import rank_workload
from shardsim.simulator.strategies.build import build_plan
from shardsim.specs.hardware.topology import Cluster
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import from_arch
from tests.helpers import instance

TIED = Arch("gpt", hidden=64, layers=2, heads=4, ffn=128, seq_len=32, vocab=250, tied_embeddings=True)  # 250: uneven
CASES = {  # id: (strategy, world)
    "tp2": (Strategy("pipeline", pp=2, microbatches=2, tp=2), 4),
    "fsdp2": (Strategy("pipeline", pp=2, microbatches=2, degree=2), 4),
    "tp2-fsdp2": (Strategy("pipeline", pp=2, microbatches=2, tp=2, degree=2), 8),
}


def _config(strategy: Strategy) -> RunConfig:
    return RunConfig(workload=TIED, strategy=strategy, batch_per_device=2, checkpointing="none", backend="gloo")


def planned_sum(cfg: RunConfig, world: int, rank: int) -> tuple[str, int, tuple[int, ...]]:
    """(kind, elements, ranks) of the plan's tied all-reduce, the group of `rank`."""
    w = from_arch("traced", TIED)
    cfg, res = resolve(cfg, world, len(w.layers), tied_embeddings=True, arch=w.arch, devices_per_node=world)
    cm = ComputeModel(Cluster(instance(devices=world), 1).instance.device, cfg.precision, arch=w.arch, tp=res.tp)
    plan = build_plan(cfg, res, rank_workload(w, res.tp, cfg.strategy.sequence_parallel), cm)
    (op,) = [o for o in plan.ops if o.name == "AR tied embedding grad"]
    group = next(tuple(sorted(int(r) for r in row)) for row in op.layout.groups() if rank in row)
    return op.coll, round(op.nbytes / 4), group  # fp32 gradients


@pytest.mark.parametrize("case", list(CASES))
def test_the_tied_sum_is_the_runtimes(case: str) -> None:
    strategy, world = CASES[case]
    cfg = _config(strategy)
    # the first rank of each end (stage-major ranks): the first shard, which the plan sizes (the largest)
    for rank in (0, world // 2):
        calls = trace_step(cfg, world, rank=rank, devices_per_node=world)
        traced = [(c.kind, c.numel, tuple(sorted(c.ranks))) for c in calls if not c.group]  # outside the mesh
        assert traced == [planned_sum(cfg, world, rank)], f"rank {rank}"


def test_a_stage_between_takes_no_part() -> None:
    cfg = _config(Strategy("pipeline", pp=3, microbatches=3, tp=2)).replace(workload=replace(TIED, layers=3))
    calls = trace_step(cfg, 6, rank=2, devices_per_node=6)  # stage 1 of 3
    assert calls and not [c for c in calls if not c.group]
