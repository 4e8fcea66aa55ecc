"""A configuration checked against its world size and model: defaults settled, sizes derived."""

from __future__ import annotations

from shardsim.config.cp import check_cp
from shardsim.config.ds_config import check_deepspeed
from shardsim.config.ep import check_ep
from shardsim.config.moe import check_moe
from shardsim.config.schema import Resolved, RunConfig
from shardsim.config.strategy import MODELS, Strategy
from shardsim.config.tp import check_tp
from shardsim.core.errors import ConfigError
from shardsim.specs.bounds import world_refusal
from shardsim.specs.model.arch import Arch
from shardsim.specs.parallel_dims import ParallelDims
from shardsim.specs.stage_split import AUTO, split_counts, split_refusal
from shardsim.specs.strategies import STRATEGIES as KINDS

# A pipeline of a model whose LM head reuses the token embedding holds that matrix on its first
# stage and a copy on its last, and sums the two copies' gradients before the optimizer step (as
# Megatron-LM and torchtitan do: `simulator.strategies.pipeline.tied_embedding_all_reduce`, the
# runtime's `pipeline`), shard by shard under tensor parallelism and FSDP2; with context
# parallelism (whose stages are not planned with the copy's gradient split over the cp ranks) refused.
TIED_PIPELINE = "a pipeline of a model with tied embeddings"


def resolve(
    cfg: RunConfig,
    world: int,
    n_layers: int,
    *,
    tied_embeddings: bool = False,
    arch: Arch | None = None,
    devices_per_node: int | None = None,
) -> tuple[RunConfig, Resolved]:
    """Check the configuration against the world size and the model; settle defaults.

    Returns the normalized config (zero's degree = the data-parallel world; SMP's degree = it →
    zero) and the derived sizes. Raises ConfigError with one clear line when something does not
    fit. Tensor parallelism (tp > 1) needs the model's `arch` (heads, FFN) and is checked against
    `devices_per_node` when given (`config.tp`), context parallelism likewise (`config.cp`), expert
    parallelism against the model's experts and the shard degree (`config.ep`). The mesh is
    `Resolved.dims`: pp × dp_replicate × dp_shard × cp × ep × tp in `mesh_order`; the
    data-parallel kinds see world / (pp × tp × cp) ranks, which split the batch (the ep ranks
    among them: dp_shard is the degree / the data-parallel ranks an EP group takes, `ParallelDims.ep_dp`).
    """
    s = cfg.strategy
    where = cfg.source
    spec = s.spec
    too_big = world_refusal(world)
    if too_big:
        raise ConfigError(too_big, where=where, field="nodes")
    pp = s.pp if spec.is_pipeline else 1
    if pp > world or world % pp:
        raise ConfigError(f"pipeline degree {pp} does not divide the world size {world}", where=where, field="pp")
    if pp > n_layers:
        raise ConfigError(
            f"pipeline degree {pp} exceeds the model's {n_layers} layers (a stage holds at least one layer; the "
            "embedding and head go with the first and last)",
            where=where,
            field="pp",
        )
    check_moe(cfg.moe_imbalance, cfg.moe_capacity, arch, where)
    tp = s.tp
    tp_inner = ParallelDims(tp=tp, mesh_order=s.mesh_order).tp_inner
    if tp > 1:
        check_tp(
            tp=tp,
            sequence_parallel=s.sequence_parallel,
            async_tp=s.async_tp,
            tp_inner=tp_inner,
            across_nodes=s.tp_across_nodes,
            world=world,
            pp=pp,
            arch=arch,
            devices_per_node=devices_per_node,
            backend=cfg.backend,
            where=where,
            compiled=cfg.compile,
        )
    cp = s.cp
    if cp > 1:
        stack = {
            "attention": cfg.attention,
            "profiled": cfg.profile is not None,
            "sequence_parallel": s.sequence_parallel,
        }
        check_cp(cp=cp, world=world, pp=pp, tp=tp, arch=arch, where=where, **stack)
    # the ranks the data-parallel kinds see (a tensor-parallel group acts as one, and so does a
    # context-parallel group: its ranks share their samples)
    dp_world = world // (tp * cp)
    replicas_all = dp_world // pp
    # the data-parallel ranks of one node (zero2d's default degree: HYBRID_SHARD shards within a node)
    if cfg.library == "deepspeed":
        check_deepspeed(cfg, dp_world // pp, tp, cp, pp, s.ep)
    node_ranks = devices_per_node // (tp * cp) if devices_per_node and devices_per_node % (tp * cp) == 0 else None
    shard = spec.shard(s, dp_world, where, node_ranks)
    ep = s.ep
    if ep > 1:
        check_ep(ep=ep, shard=shard, arch=arch, where=where, pipeline=spec.is_pipeline, tp=tp, etp=s.etp)
    if pp > 1 and tied_embeddings and cp > 1:
        why = f"{TIED_PIPELINE} is planned with cp 1 only (not its embedding gradients' sum with context parallelism)"
        raise ConfigError(why, where=where, field="cp")
    if shard > replicas_all or replicas_all % shard:
        span = "the world size" if pp == 1 else f"the {replicas_all} ranks of a pipeline stage"
        if tp > 1 or cp > 1:
            over = "".join(f" / {n} {v}" for n, v in (("tp", tp), ("cp", cp), ("pp", pp)) if v > 1)
            span = f"the data-parallel ranks (world{over})"
        raise ConfigError(f"degree {shard} does not divide {span} {replicas_all}", where=where, field="degree")
    if cfg.reduce_dtype == "bf16" and shard == 1 and cfg.backend == "gloo":
        raise ConfigError(
            "DDP's bf16 gradient all-reduce (PyTorch's bf16_compress_hook) needs nccl; on gloo use fp16 or fp32",
            where=where,
            field="reduce_dtype",
        )
    kind = spec.resolved(shard, dp_world)
    settled = {"degree": None if KINDS[kind].replicates else shard, "pp": pp}
    own = MODELS[kind].model_fields
    strategy = Strategy(kind, **{k: v for k, v in {**s.model_dump(), **settled}.items() if k in own and k != "kind"})
    spec = strategy.spec
    m = strategy.microbatches
    per_replica = cfg.batch_per_device * pp  # a pipeline replica takes the batch of its pp devices
    if spec.is_pipeline and per_replica % m:
        raise ConfigError(
            f"{m} microbatches do not divide the per-replica batch {per_replica} "
            f"(batch_per_device {cfg.batch_per_device} x pp {pp})",
            where=where,
            field="microbatches",
        )
    mbs = per_replica // m if spec.is_pipeline else cfg.batch_per_device
    mesh = s.mesh  # pp, cp, ep, tp, etp: the data-parallel sizes below (dp_shard: the degree / the ranks EP takes)
    dims = mesh.replace(dp_replicate=replicas_all // shard, dp_shard=shard // mesh.ep_dp, pp=pp)
    v = strategy.stages_per_rank
    if spec.is_pipeline and pp * v > n_layers:
        why = f"pp {pp} x stages_per_rank {v} stages exceed the model's {n_layers} layers (a stage holds one at least)"
        raise ConfigError(why, where=where, field="stages_per_rank")
    counts = None
    split = strategy.layers_per_stage
    if spec.is_pipeline and split and split != AUTO:
        refused = split_refusal(split, pp * v, n_layers)
        if refused:
            raise ConfigError(refused, where=where, field="layers_per_stage")
        counts = tuple(split_counts(split))
    res = Resolved(dims, m, mbs, cfg.batch_per_device * dp_world * cfg.grad_accum, strategy.schedule, v, counts)
    return cfg.replace(strategy=strategy), res
