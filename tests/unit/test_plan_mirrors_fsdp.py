"""The simulator's plan issues exactly the collectives FSDP2 issues (kind, size, group).

FSDP2 is applied with the runtime's own `apply_fsdp` and traced in one process with
PyTorch's fake process group under FakeTensorMode, at world sizes up to 1,024."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.runtime.collective_trace import trace_fsdp_step
from shardsim.runtime.models.builders import build_model
from shardsim.runtime.strategies.fsdp import apply_fsdp
from shardsim.simulator.compute import DTYPE_BYTES, ComputeModel
from shardsim.simulator.plan import Plan
from shardsim.simulator.strategies.build import build_plan
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.library import PRESETS

# Every parameter's first dimension divides 1,024, so FSDP2 pads nothing and sizes compare exactly.
WIDE_MLP = Arch("mlp", hidden=4096, layers=4, ffn=16384, classes=1024)


def plan_collectives(plan: Plan, precision: str, rank_class: int | None = None) -> list[tuple[str, int, int]]:
    """(kind, elements, group size) of the plan's collectives (of one rank class), in program order."""
    b = DTYPE_BYTES[precision]
    return [
        (op.coll, round(op.nbytes / b), op.layout.size)
        for op in plan.ops
        if op.kind == "comm" and op.coll != "send_recv" and rank_class in (None, op.rank_class)
    ]


def assert_equal_up_to_padding(
    plan: list[tuple[str, int, int]], trace: list[tuple[str, int, int]], row: int, shard: int
):
    """The same collectives, each traced size at most one padded row per parameter above the
    planned one: FSDP2 pads a parameter's first dimension to a multiple of the shard size,
    the simulator knows no shapes. `row`: the widest padded row times the padded parameters."""
    assert [(k, g) for k, _, g in plan] == [(k, g) for k, _, g in trace]
    for (_, n_plan, _), (_, n_trace, _) in zip(plan, trace, strict=True):
        assert 0 <= n_trace - n_plan <= row * (shard - 1)


def planned(arch: Arch, world: int, shard: int, grad_accum: int) -> Counter:
    kind = "zero" if shard == world else "zero2d"
    cfg = RunConfig(
        workload="traced",
        topology="p4d.24xlarge",
        nodes=world // 8,
        strategy=Strategy(kind, degree=shard),
        batch_per_device=2,
        grad_accum=grad_accum,
        checkpointing=False,
    )
    cluster = make_cluster("p4d.24xlarge", world // 8)
    w = from_arch("traced", arch)
    cfg, res = resolve(cfg, cluster.world, len(w.layers))
    plan = build_plan(cfg, res, w, ComputeModel(cluster.instance.device, cfg.precision))
    return Counter(plan_collectives(plan, cfg.precision))


def traced(arch: Arch, world: int, shard: int, grad_accum: int) -> Counter:
    calls = trace_fsdp_step(lambda: build_model(arch), world, shard, apply_fsdp, grad_accum=grad_accum)
    return Counter((c.kind, c.numel, c.group_size) for c in calls)


@pytest.mark.parametrize(
    ("arch", "world", "shard", "accum"),
    [
        (PRESETS["tiny-gpt"], 8, 8, 1),  # zero
        (PRESETS["tiny-gpt"], 16, 8, 1),  # zero2d, 2 replicas
        (PRESETS["tiny-gpt"], 16, 4, 2),  # zero2d with accumulation: all-reduce only at the boundary
        (WIDE_MLP, 1024, 8, 1),  # (128, 8) mesh, the design card's example
        (WIDE_MLP, 1024, 1024, 1),  # zero over 1,024 ranks
    ],
    ids=["gpt-zero-8", "gpt-zero2d-16x8", "gpt-zero2d-16x4-accum2", "mlp-zero2d-1024x8", "mlp-zero-1024"],
)
def test_plan_collectives_equal_fsdp2_trace(arch: Arch, world: int, shard: int, accum: int) -> None:
    assert planned(arch, world, shard, accum) == traced(arch, world, shard, accum)


def test_padding_is_the_only_difference_for_odd_shapes() -> None:
    """FSDP2 pads each parameter's first dimension to a multiple of the shard size; the
    simulator does not know shapes and does not pad. ViT's [CLS] (dim 0 = 1) and position
    table (dim 0 = 17) are padded here: same collectives, sizes within one padded row each."""
    arch, world, shard = PRESETS["tiny-vit"], 8, 2
    plan = sorted(planned(arch, world, shard, 1).elements())
    trace = sorted(traced(arch, world, shard, 1).elements())
    assert_equal_up_to_padding(plan, trace, 2 * arch.hidden, shard)


def planned_bytes(arch: Arch, world: int, shard: int, accum: int, **settings) -> Counter:
    """(kind, bytes, group size) of the plan's collectives for a configuration with `settings`."""
    kind = "zero" if shard == world else "zero2d"
    rest = settings.pop("reshard_after_forward", True)
    cfg = RunConfig(workload="traced", topology="p4d.24xlarge", nodes=world // 8, batch_per_device=2,
                    strategy=Strategy(kind, degree=shard, reshard_after_forward=rest), grad_accum=accum,
                    checkpointing=False, **settings)  # fmt: skip
    cluster = make_cluster("p4d.24xlarge", world // 8)
    w = from_arch("traced", arch)
    cfg, res = resolve(cfg, cluster.world, len(w.layers))
    plan = build_plan(cfg, res, w, ComputeModel(cluster.instance.device, cfg.precision))
    return Counter((op.coll, round(op.nbytes), op.layout.size) for op in plan.ops if op.kind == "comm")


def traced_bytes(arch: Arch, world: int, shard: int, accum: int, **fsdp_kwargs) -> Counter:
    apply = functools.partial(apply_fsdp, **fsdp_kwargs)
    calls = trace_fsdp_step(lambda: build_model(arch), world, shard, apply, grad_accum=accum)
    return Counter((c.kind, c.numel * c.itemsize, c.group_size) for c in calls)


@pytest.mark.parametrize(
    ("arch", "world", "shard", "accum"),
    [
        (PRESETS["tiny-gpt"], 8, 8, 1),
        (PRESETS["tiny-gpt"], 16, 4, 2),
        (WIDE_MLP, 1024, 8, 1),
    ],
    ids=["gpt-zero-8", "gpt-zero2d-16x4-accum2", "mlp-zero2d-1024x8"],
)
def test_zero2_plan_equals_fsdp2_trace(arch: Arch, world: int, shard: int, accum: int) -> None:
    """ZeRO-2 (reshard_after_forward=False): one all-gather per unit per micro-step, none in backward."""
    plan = planned_bytes(arch, world, shard, accum, reshard_after_forward=False)
    assert plan == traced_bytes(arch, world, shard, accum, reshard_after_forward=False)
    gathers = sum(n for (k, _, _), n in plan.items() if k == "all_gather")
    assert gathers == accum * (arch.layers + 1)  # the layers and the root, once per micro-step
    assert gathers < sum(n for (k, _, _), n in planned_bytes(arch, world, shard, accum).items() if k == "all_gather")


@pytest.mark.parametrize("reduce", ["fp32", "bf16"])
def test_reduce_dtype_bytes_equal_fsdp2_trace(reduce: str) -> None:
    """bf16 parameters: all-gathers in bf16, gradient reduce-scatters and all-reduces in the reduce dtype."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    arch, world, shard = PRESETS["tiny-gpt"], 16, 8
    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=getattr(torch, {"fp32": "float32"}.get(reduce, "bfloat16"))
    )
    plan = planned_bytes(arch, world, shard, 1, precision="bf16", reduce_dtype=reduce)
    assert plan == traced_bytes(arch, world, shard, 1, mp_policy=mp)
    rs = [b for (k, b, _) in plan if k == "reduce_scatter"]
    ag = [b for (k, b, _) in plan if k == "all_gather"]
    assert sorted(rs) == sorted(x * (2 if reduce == "fp32" else 1) for x in ag)
