"""Strategies: each builds the plan (`simulator.plan`) of one training step as PyTorch runs it:
`ddp`, `fsdp` (zero, zero2d) and `pipeline` (whose stages run DDP or FSDP2); `steps` holds what
they share."""

from __future__ import annotations

from shardsim.simulator.checkpointing import checkpointing_of
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.config import Resolved, RunConfig
from shardsim.simulator.gcpause import paused_gc
from shardsim.simulator.plan import Plan
from shardsim.simulator.strategies.ddp import ddp_plan
from shardsim.simulator.strategies.fsdp import zero_plan
from shardsim.simulator.strategies.pipeline import pipeline_plan
from shardsim.simulator.strategies.steps import BlockTimes
from shardsim.simulator.workload.model import Workload


def overlaps(cfg: RunConfig, res: Resolved) -> bool:
    """Does communication overlap compute? NCCL runs on its own CUDA streams; on CPU with
    gloo FSDP2 has no streams (serialized), DDP's reducer still runs gloo asynchronously,
    also when it wraps the stages of a pipeline whose stages are replicated, not sharded."""
    ddp = cfg.strategy.kind == "ddp" or (cfg.strategy.kind == "pipeline" and res.shard == 1)
    return cfg.backend == "nccl" or ddp


def build_plan(cfg: RunConfig, res: Resolved, w: Workload, cm: ComputeModel) -> Plan:
    """The plan of one training step of `cfg`'s strategy."""
    layer_params = sum(b.params for b in w.layers)
    p = Plan(overlap=overlaps(cfg, res), fsdp=cm.fsdp_cpu(w.params, layer_params))
    cm = BlockTimes(cm, checkpointing_of(cfg, w.layers))  # type: ignore[assignment]
    with paused_gc():
        if cfg.strategy.kind == "pipeline":
            pipeline_plan(p, cm, cfg, res, w)
        elif cfg.strategy.kind == "ddp":
            ddp_plan(p, cm, cfg, res, w)
        else:
            zero_plan(p, cm, cfg, res, w)
    return p
