"""The plan of one training step, built by the strategy's planner (`planners.PLANNERS`)."""

from __future__ import annotations

from shardsim.config import Resolved, RunConfig
from shardsim.simulator.async_tp import AsyncTp
from shardsim.simulator.checkpointing import Checkpointing, checkpointing_of
from shardsim.simulator.compute import DTYPE_BYTES, ComputeModel
from shardsim.simulator.gcpause import paused_gc
from shardsim.simulator.network.collectives import call_alone_s
from shardsim.simulator.network.links import LinkGraph, links_for
from shardsim.simulator.plan import Plan
from shardsim.simulator.strategies.context_parallel import ContextParallel, context_parallel
from shardsim.simulator.strategies.deepspeed_zero import DEEPSPEED_STAGES, plan_deepspeed, stage_of
from shardsim.simulator.strategies.expert_parallel import ExpertParallel, ep_groups
from shardsim.simulator.strategies.mesh import stage_mesh
from shardsim.simulator.strategies.planners import PLANNERS
from shardsim.simulator.strategies.steps import BlockTimes
from shardsim.simulator.strategies.tensor_parallel import TensorParallel, tensor_parallel
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.workload import Workload


def overlaps(cfg: RunConfig, res: Resolved) -> bool:
    """Does communication overlap compute? NCCL runs on its own CUDA streams; on CPU with
    gloo the kind decides (FSDP2 has no streams; DDP's reducer runs gloo asynchronously)."""
    return cfg.backend == "nccl" or PLANNERS[cfg.strategy.kind].overlaps(res)


def plan_tensor_parallel(
    cfg: RunConfig, res: Resolved, w: Workload, ckpt: Checkpointing, cm: ComputeModel, links: LinkGraph | None = None
) -> TensorParallel | None:
    """The tensor parallelism of `cfg`'s plan (None without): each block's collectives on each
    stage's tensor-parallel groups; `w` is one rank's model, `ckpt` its checkpointing; with asyncTP
    its fused pairs costed on `cm` and `links` (the cluster's, `links_for`: built from `cfg` when
    not given)."""
    if res.tp == 1:
        return None
    assert w.arch is not None and w.tp == res.tp, "tensor parallelism plans the per-rank workload of an Arch"
    meshes = [stage_mesh(res, s) for s in range(res.pp)]
    s, esize, gsize = cfg.strategy, DTYPE_BYTES[cfg.precision], DTYPE_BYTES[cfg.grad_dtype]
    recomputed = frozenset(b.name for b in w.layers) if ckpt.op_level else ckpt.full
    fused = None
    if s.async_tp:
        g = links or links_for(make_cluster(cfg.topology, cfg.nodes, cfg.gpus_per_node))
        fused = AsyncTp(cm, res.tp, lambda coll, lay, nbytes: call_alone_s(g, coll, lay, nbytes, "auto", cfg.backend))
    return tensor_parallel(w.arch, w.blocks, meshes, s.sequence_parallel, esize, gsize, recomputed, fused)


def plan_context_parallel(
    cfg: RunConfig, res: Resolved, w: Workload, cm: ComputeModel, ckpt: Checkpointing
) -> ContextParallel | None:
    """The context parallelism of `cfg`'s plan (None without): each layer's ring attention on each
    stage's context-parallel groups; `w` is one rank's model (a cp-th of each sequence)."""
    if res.cp == 1:
        return None
    assert w.arch is not None, "context parallelism plans the per-rank workload of an Arch"
    meshes = [stage_mesh(res, s) for s in range(res.pp)]
    layer = w.layers[0]
    esize = DTYPE_BYTES[cfg.precision]
    return context_parallel(
        w.arch, meshes, res.tp, res.cp, cfg.strategy.cp_rotate, esize, lambda mb: cm.attention_s(layer, mb), ckpt.full
    )


def build_plan(cfg: RunConfig, res: Resolved, w: Workload, cm: ComputeModel, links: LinkGraph | None = None) -> Plan:
    """The plan of one training step of `cfg`'s strategy; `w` is the model as one rank runs it
    (with tensor parallelism, one tensor-parallel rank's shards: `blocks.from_arch`); `links` the
    cluster's (`plan_tensor_parallel`)."""
    layer_params = sum(b.params for b in w.layers)
    p = Plan(overlap=overlaps(cfg, res), fsdp=cm.fsdp_cpu(w.params, layer_params))
    ckpt = checkpointing_of(cfg, w.layers)
    p.tp = plan_tensor_parallel(cfg, res, w, ckpt, cm, links)
    p.cp = plan_context_parallel(cfg, res, w, cm, ckpt)
    cm = BlockTimes(cm, ckpt)  # type: ignore[assignment]
    if res.ep > 1:
        groups = [ep_groups(res.dims, r) for r in range(res.pp)]  # a rank class per pipeline rank
        p.ep = ExpertParallel(groups, cm, cfg, res.ep)  # type: ignore[arg-type]
    with paused_gc():
        if cfg.library == "deepspeed" and stage_of(cfg) in DEEPSPEED_STAGES:  # DeepSpeed's own stages
            plan_deepspeed(p, cm, cfg, res, w)
        else:
            PLANNERS[cfg.strategy.kind].plan(p, cm, cfg, res, w)
    return p
