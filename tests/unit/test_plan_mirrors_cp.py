"""The simulator's plan issues the collectives PyTorch's ring attention issues for one layer's
attention forward and backward (kind, bytes, count, group size), with either rotate method:
PyTorch's own ring (`_templated_ring_attention` and its backward) traced in one process under the
fake process group (`runtime.ring_attention_trace`), against the plan's ops on the cp stream."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.runtime.ring_attention_trace import trace_ring_attention
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.predict import rank_workload
from shardsim.simulator.strategies.build import build_plan
from shardsim.specs.hardware.topology import Cluster
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import from_arch
from tests.helpers import instance

LLAMA = Arch("llama", hidden=64, layers=2, heads=4, ffn=128, seq_len=32, vocab=256)
BATCH = 2
PHASES = {"fwd": "forward", "bwd": "backward"}
KINDS = {"all_gather": "all_gather", "send_recv": "all_to_all"}  # a ring pass is PyTorch's permute_tensor
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def planned(cp: int, rotate: str, precision: str) -> Counter:
    """(phase, kind, bytes, group size) of layer0's collectives on the cp stream of the plan."""
    strategy = Strategy("zero", cp=cp, cp_rotate=rotate)
    cfg = RunConfig(
        workload=LLAMA, strategy=strategy, batch_per_device=BATCH, checkpointing="none", precision=precision
    )
    w = from_arch("traced", LLAMA)
    cfg, res = resolve(cfg, cp, len(w.layers), arch=LLAMA, devices_per_node=cp)
    ranks_w = rank_workload(w, res.tp, False, cp=res.cp)
    cm = ComputeModel(Cluster(instance(devices=cp), 1).instance.device, precision, arch=ranks_w.arch, cp=res.cp)
    plan = build_plan(cfg, res, ranks_w, cm)
    ops = [o for o in plan.ops if o.stream == "cp" and " layer0" in o.name]
    return Counter((PHASES[o.phase], KINDS[o.coll], round(o.nbytes), o.layout.size) for o in ops)


def traced(cp: int, rotate: str, precision: str) -> Counter:
    calls = trace_ring_attention(
        cp=cp,
        rotate=rotate,
        batch=BATCH,
        heads=LLAMA.heads,
        tokens=LLAMA.seq_len // cp,
        head_dim=LLAMA.head_dim,
        dtype=TORCH_DTYPES[precision],
    )
    assert all(c.group == "cp" for c in calls)
    return Counter((c.phase, c.kind, c.numel * c.itemsize, c.group_size) for c in calls)


@pytest.mark.parametrize(
    ("cp", "rotate", "precision"),
    [(2, "allgather", "fp32"), (4, "allgather", "bf16"), (2, "alltoall", "bf16"), (4, "alltoall", "fp32")],
)
def test_ring_attention_collectives(cp: int, rotate: str, precision: str) -> None:
    plan = planned(cp, rotate, precision)
    assert plan  # the plan has them
    assert plan == traced(cp, rotate, precision)
