"""What would make a configuration fit in memory, when it does not: each remedy tried on the
memory model alone (no step is simulated) and named with the memory it leaves per rank.

The remedies, each alone: a smaller batch per device (the largest that fits; under a fixed global
batch, more accumulation steps make up the rest), full activation checkpointing, sharding over
more ranks (FSDP over every data-parallel rank, or a pipeline's stages sharded over all theirs),
for a pipeline more stages and smaller microbatches (the fewest stages, the most samples per
microbatch, that fit), and more nodes (the fewest, doubling then bisection, up to
`MAX_NODES_FACTOR` × today's).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.core.errors import ConfigError
from shardsim.core.units import GIB, format_bytes
from shardsim.specs.bounds import MAX_WORLD
from shardsim.specs.hardware.topology import Cluster, make_cluster
from shardsim.specs.model.workload import Workload
from shardsim.specs.strategies.zero import ZERO
from shardsim.sweep.batch import _rank_workload, largest_fitting

MAX_NODES_FACTOR = 64  # how far the node search goes: up to 64 × the cluster's nodes (and the world bound)


@dataclass(frozen=True)
class Remedy:
    """One change and the memory per rank it leaves (None: the change is refused there)."""

    change: str
    required_gib: float | None
    fits: bool


def required_gib(cfg: RunConfig, cluster: Cluster, w: Workload) -> float | None:
    """The memory one rank of `cfg` needs on `cluster` (`predict.step_memory`), None where refused."""
    from shardsim.simulator.predict import step_memory

    try:
        cfg, res = resolve(
            cfg,
            cluster.world,
            len(w.layers) or len(w.blocks),
            tied_embeddings=w.tied_embeddings,
            arch=w.arch,
            devices_per_node=cluster.devices_per_node,
        )
    except ConfigError:
        return None
    return step_memory(
        cfg,
        res,
        _rank_workload(w, res.tp, cfg.strategy.sequence_parallel, res.cp, res.dims.expert_tp),
        cluster,
    ).required_gib


def _remedy(change: str, cfg: RunConfig, cluster: Cluster, w: Workload) -> Remedy:
    need = required_gib(cfg, cluster, w)
    return Remedy(change, need, need is not None and need <= cluster.instance.device.memory_gib)


def _smaller_batch(cfg: RunConfig, cluster: Cluster, w: Workload, global_batch: int | None) -> Remedy | None:
    """The largest smaller batch per device that fits (grad_accum making up a fixed global batch)."""
    b = cfg.batch_per_device
    if b <= 1:
        return None
    dp_share = None if global_batch is None else b * cfg.grad_accum  # samples per data-parallel rank

    def at(x: int) -> RunConfig:
        return cfg.replace(batch_per_device=x, grad_accum=cfg.grad_accum if dp_share is None else dp_share // x)

    candidates = [x for x in range(1, b) if dp_share is None or dp_share % x == 0]
    dev = cluster.instance.device.memory_gib
    found = largest_fitting(candidates, lambda x: (required_gib(at(x), cluster, w) or float("inf")) <= dev)
    x = found or candidates[0]
    what = f"batch {x}/device" + (f" x grad_accum {at(x).grad_accum}" if dp_share is not None else "")
    return _remedy(what, at(x), cluster, w)


def _wider_shard(cfg: RunConfig, cluster: Cluster, w: Workload) -> Remedy | None:
    """FSDP over every data-parallel rank (or a pipeline's stages over all theirs), where it shards over fewer."""
    s = cfg.strategy
    tp = s.tp
    if s.spec.is_pipeline:
        ranks = cluster.world // (s.pp * tp)
        if (s.degree or 1) >= ranks:
            return None
        return _remedy(f"stages sharded over {ranks}", cfg.replace(strategy=s.replace(degree=ranks)), cluster, w)
    if s.kind == ZERO.name:
        return None
    extra = {"tp": tp, "sequence_parallel": s.sequence_parallel, "async_tp": s.async_tp}
    zero = Strategy(ZERO.name, **extra)
    return _remedy(f"{ZERO.name} (sharded over all {cluster.world // tp})", cfg.replace(strategy=zero), cluster, w)


def _first_fitting(changes: list[tuple[str, RunConfig]], cluster: Cluster, w: Workload) -> Remedy | None:
    """The first of `changes` (ordered from the least change) that fits, else the one that leaves
    the least memory; None where the memory model takes none of them."""
    taken = []
    for change, changed in changes:
        r = _remedy(change, changed, cluster, w)
        if r.fits:
            return r
        if r.required_gib is not None:
            taken.append(r)
    return min(taken, key=lambda r: r.required_gib, default=None)


def _more_stages(cfg: RunConfig, cluster: Cluster, w: Workload) -> Remedy | None:
    """A pipeline's fewest stages (more than today's, dividing the ranks, at most a layer each)
    that fit, each microbatch as large as today (a replica's batch grows with its stages)."""
    s = cfg.strategy
    if not s.spec.is_pipeline:
        return None
    ranks = cluster.world // s.tp
    layers = len(w.layers) or len(w.blocks)
    changes = [
        (
            f"pp {pp} x {s.microbatches * pp // s.pp} microbatches",
            cfg.replace(strategy=s.replace(pp=pp, microbatches=s.microbatches * pp // s.pp)),
        )
        for pp in range(s.pp + 1, min(ranks, layers) + 1)
        if ranks % pp == 0 and s.microbatches * pp % s.pp == 0
    ]
    return _first_fitting(changes, cluster, w)


def _smaller_microbatches(cfg: RunConfig, cluster: Cluster, w: Workload) -> Remedy | None:
    """A pipeline's fewest microbatches (more than today's, dividing its per-replica batch) that
    fit: smaller microbatches hold fewer activations in flight."""
    s = cfg.strategy
    if not s.spec.is_pipeline:
        return None
    per_replica = cfg.batch_per_device * s.pp
    changes = [
        (f"{m} microbatches of {per_replica // m}", cfg.replace(strategy=s.replace(microbatches=m)))
        for m in range(s.microbatches + 1, per_replica + 1)
        if per_replica % m == 0
    ]
    return _first_fitting(changes, cluster, w)


def _more_nodes(cfg: RunConfig, cluster: Cluster, w: Workload) -> Remedy | None:
    """The fewest nodes (up to `MAX_NODES_FACTOR` × today's) at which the strategy fits."""
    s = cfg.strategy
    if s.kind == ZERO.name:  # its degree is the world: settled again on each cluster
        cfg = cfg.replace(strategy=s.replace(degree=None))
    per_node = cluster.world // cluster.nodes
    top = min(cluster.nodes * MAX_NODES_FACTOR, MAX_WORLD // per_node)
    candidates = list(range(cluster.nodes + 1, top + 1))
    dev = cluster.instance.device.memory_gib

    def fits(n: int) -> bool:
        need = required_gib(cfg.replace(nodes=n), make_cluster(cluster.instance, n), w)
        return need is not None and need <= dev

    # more nodes shard more where the strategy shards over the world (monotone: it fits from some
    # node count on, searched from the top down); a fixed shard degree fits at none
    if not candidates:
        return None
    n = largest_fitting(candidates[::-1], fits)
    if n is None:  # not even at the most nodes searched: say what that leaves
        n = candidates[-1]
    return _remedy(f"{n} nodes", cfg.replace(nodes=n), make_cluster(cluster.instance, n), w)


def fit_hint(cfg: RunConfig, cluster: Cluster, w: Workload, global_batch: int | None = None) -> str:
    """One line: what makes `cfg` (which does not fit on `cluster`) fit, each remedy alone with
    the memory per rank it leaves, or that none does alone."""
    remedies = [
        _smaller_batch(cfg, cluster, w, global_batch),
        None
        if cfg.checkpointing == "full"
        else _remedy("full checkpointing", cfg.replace(checkpointing="full"), cluster, w),
        _wider_shard(cfg, cluster, w),
        _more_stages(cfg, cluster, w),
        _smaller_microbatches(cfg, cluster, w),
        _more_nodes(cfg, cluster, w),
    ]
    tried = [r for r in remedies if r is not None and r.required_gib is not None]
    works = [r for r in tried if r.fits]
    dev = format_bytes(cluster.instance.device.memory_gib * GIB)
    if works:
        return (
            "it fits with "
            + ", or ".join(f"{r.change} ({format_bytes(r.required_gib * GIB)})" for r in works)
            + f" of {dev}"
        )
    if not tried:
        return (
            "no smaller batch, checkpointing, wider sharding, more stages or microbatches, or more nodes applies to it"
        )
    each = "; ".join(f"{r.change}: {format_bytes(r.required_gib * GIB)}" for r in tried)
    return f"no single change tried makes it fit in {dev} ({each}): combine them, or take a larger device"
