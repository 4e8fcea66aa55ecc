"""ZeRO-1 (strategy zero1) in the simulator: DDP's step with Adam's state and step partitioned
over the data-parallel ranks and each partition broadcast after it; the partition's size as
PyTorch's `ZeroRedundancyOptimizer` makes it; zero1 only in sweeps that name it."""

from __future__ import annotations

import pytest

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.core.errors import ConfigError
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.predict import predict
from shardsim.simulator.strategies.build import build_plan
from shardsim.simulator.strategies.zero1 import PARAM_BYTES, largest_partition
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import make_cluster
from shardsim.sweep.space import SweepSpace, enumerate_configs

BASE = dict(workload="gpt2-xl", topology="p4d.24xlarge", nodes=2, precision="bf16", batch_per_device=2)


def plan_of(kind: str, **over):
    cfg = RunConfig(**{**BASE, **over}, strategy=Strategy(kind))
    w = load_workload(cfg.workload)
    cfg, res = resolve(cfg, 16, len([b for b in w.blocks if b.kind == "layer"]))
    cm = ComputeModel(make_cluster(cfg.topology, cfg.nodes).instance.device, cfg.precision)
    return build_plan(cfg, res, w, cm), w


def comms(plan, coll):
    return [op for op in plan.ops if op.kind == "comm" and op.coll == coll]


def test_zero1_is_ddp_then_a_partitioned_step_and_a_broadcast_from_every_rank():
    ddp, w = plan_of("ddp")
    z1, _ = plan_of("zero1")
    # the same gradient all-reduces as DDP's
    assert [(o.nbytes, o.layout.size) for o in comms(z1, "all_reduce")] == [
        (o.nbytes, o.layout.size) for o in comms(ddp, "all_reduce")
    ]
    casts = comms(z1, "broadcast")
    assert len(casts) == 16 and {o.layout.size for o in casts} == {16}
    assert sum(o.nbytes for o in casts) == pytest.approx(w.params * PARAM_BYTES)
    (step,) = [o for o in z1.ops if o.kind == "optimizer"]
    (full,) = [o for o in ddp.ops if o.kind == "optimizer"]
    assert step.duration < full.duration / 8  # a 16th of the parameters, or the largest tensor
    assert casts[0].id > step.id  # the broadcasts follow the step


def test_zero1_memory_partitions_only_adams_state():
    ddp = predict(RunConfig(**BASE, strategy=Strategy("ddp"))).memory
    z1 = predict(RunConfig(**BASE, strategy=Strategy("zero1"))).memory
    assert (z1["params_gib"], z1["grads_gib"]) == (ddp["params_gib"], ddp["grads_gib"])
    w = load_workload("gpt2-xl")
    share = largest_partition(w.params, list(w.blocks), 16) / w.params
    assert z1["optimizer_gib"] == pytest.approx(ddp["optimizer_gib"] * share)
    assert z1["step_temporaries_gib"] == pytest.approx(ddp["step_temporaries_gib"] * share)
    assert ddp["optimizer_gib"] / 17 < z1["optimizer_gib"] < ddp["optimizer_gib"] / 8


def test_zero1_composes_with_tensor_parallelism():
    p = predict(RunConfig(**{**BASE, "workload": "llama-2-7b"}, strategy=Strategy("zero1", tp=2)))
    assert p.collectives["broadcast"] == 8  # over the 8 data-parallel ranks


def test_a_shard_degree_is_refused():
    with pytest.raises(ConfigError, match="zero1 shards Adam") as err:
        RunConfig(**BASE, strategy={"kind": "zero1", "degree": 4})
    assert err.value.field == "degree"


def test_sweeps_try_zero1_only_when_named():
    cfg = RunConfig(**BASE)
    default = {c.cfg.strategy.kind for c in enumerate_configs(cfg, SweepSpace()).candidates}
    assert "zero1" not in default and "ddp" in default
    named = enumerate_configs(cfg, SweepSpace(strategies=("zero1", "ddp"))).candidates
    assert {c.cfg.strategy.kind for c in named} == {"zero1", "ddp"}


@pytest.mark.parametrize("dp", [8, 64])
def test_the_largest_partition_is_pytorchs(dp):
    """PyTorch's own partition (ZeroRedundancyOptimizer under the fake process group, the model
    built under FakeTensorMode): its busiest rank within 0.1% of `largest_partition` (gpt2-xl at
    64 ranks: its 80M-element token embedding alone, 3.3 times a 64th of the model)."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardsim.runtime.models import build as workloads
    from shardsim.specs.model.arch import Shape

    dist.init_process_group("fake", rank=0, world_size=dp, store=FakeStore())
    try:
        with FakeTensorMode():
            model = workloads.build("gpt2-xl", 0, Shape())
            z = ZeroRedundancyOptimizer(list(model.parameters()), optimizer_class=torch.optim.Adam)
            parts = [sum(p.numel() for g in rank for p in g["params"]) for rank in z._partition_parameters()]
            total = sum(p.numel() for p in model.parameters())
    finally:
        dist.destroy_process_group()
    w = load_workload("gpt2-xl")
    assert w.params == total
    assert max(parts) == pytest.approx(largest_partition(w.params, list(w.blocks), dp), rel=1e-3)
