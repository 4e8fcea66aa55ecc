"""One configuration schema for the simulator and the runtime.

A configuration is read from a YAML file, then overridden by command-line flags. It also
accepts SageMaker model-parallel keys as users paste them (flat, or as the whole
``distribution`` block of a PyTorch estimator), so ``sharded_data_parallel_degree: 32``
means the same as ``strategy: zero`` on 32 GPUs.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from shardsim.simulator.errors import ConfigError
from shardsim.simulator.yamlio import Fields, load_yaml

STRATEGIES = ("ddp", "zero", "zero2d", "pipeline")
SCHEDULES = ("gpipe", "1f1b")
PRECISIONS = ("fp32", "fp16", "bf16")
BACKENDS = ("nccl", "gloo")


@dataclass(frozen=True)
class Strategy:
    """How the model is distributed.

    kind: ddp | zero (shard over the world) | zero2d (shard within groups of `degree`
    consecutive ranks, replicate across groups) | pipeline (`pp` stages of consecutive
    blocks, `microbatches`, `schedule`; `degree` shards each stage over its replicas).
    `degree` None means: the world for zero, 1 (plain data parallel) for pipeline.
    """

    kind: str = "zero"
    degree: int | None = None
    pp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"

    def label(self) -> str:
        if self.kind == "pipeline":
            shard = f" d={self.degree}" if self.degree and self.degree > 1 else ""
            return f"pipeline pp={self.pp} m={self.microbatches} {self.schedule}{shard}"
        if self.kind == "zero2d":
            return f"zero2d d={self.degree}"
        return self.kind


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training step, for prediction and for a real run."""

    workload: str = "vit-630m"
    topology: str = "g4dn.12xlarge"
    nodes: int | None = 8
    strategy: Strategy = field(default_factory=Strategy)
    batch_per_device: int = 4
    grad_accum: int = 1
    precision: str = "fp32"
    checkpointing: bool = True
    backend: str = "nccl"
    optimizer: str = "adam"
    profile: str | None = None
    seed: int = 0
    source: str = "defaults"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("source")
        return d


@dataclass(frozen=True)
class Resolved:
    """A configuration checked against its cluster: the numbers every consumer needs."""

    world: int
    shard: int  # ranks a parameter is sharded over (1 = replicated)
    replicas: int  # data-parallel replicas of each model piece (per stage for pipeline)
    pp: int
    microbatches: int
    microbatch_size: int  # samples per microbatch on one pipeline replica / one rank
    global_batch: int  # samples per optimizer step, all ranks, all accumulation steps


_SMP_KEYS = (
    "sharded_data_parallel_degree",
    "hybrid_shard_degree",
    "pipeline_parallel_degree",
    "partitions",
    "microbatches",
    "ddp",
    "pipeline",
    "tensor_parallel_degree",
    "delayed_parameter_initialization",
    "placement_strategy",
    "optimize",
    "auto_partition",
    "default_partition",
    "activation_loading_horizon",
    "fp16",
    "bf16",
    "sharded_data_parallel_degree_pipeline",
)


def _smp_parameters(data: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pull SageMaker keys out of a mapping: flat, or from a pasted `distribution` block."""
    smp: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    dist = data.get("distribution")
    if isinstance(dist, dict):
        mp = (
            dist.get("smdistributed", {}).get("modelparallel", {})
            if isinstance(dist.get("smdistributed"), dict)
            else {}
        )
        params = mp.get("parameters", {}) if isinstance(mp, dict) else {}
        if not isinstance(params, dict):
            raise ConfigError(
                "expected a mapping", where=where, field="distribution.smdistributed.modelparallel.parameters"
            )
        smp.update(params)
        mpi = dist.get("mpi") or dist.get("torch_distributed") or {}
        if isinstance(mpi, dict) and "processes_per_host" in mpi:
            extra["processes_per_host"] = mpi["processes_per_host"]
    elif dist is not None:
        raise ConfigError("expected a mapping (a SageMaker distribution block)", where=where, field="distribution")
    for key in _SMP_KEYS:
        if key in data:
            smp[key] = data[key]
    for key in ("instance_type", "instance_count"):
        if key in data:
            extra[key] = data[key]
    return smp, extra


def _pos_int(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"expected an integer >= 1, got {value!r}", where=where, field=name)
    return value


def _apply_smp(values: dict[str, Any], smp: dict[str, Any], extra: dict[str, Any], where: str) -> None:
    """Translate SageMaker keys into shardsim fields, refusing contradictions."""

    def put(key: str, value: Any, origin: str) -> None:
        if key in values and values[key] != value:
            raise ConfigError(
                f"contradicts {key}={values[key]!r} given elsewhere (SageMaker key gives {value!r})",
                where=where,
                field=origin,
            )
        values[key] = value

    if "instance_type" in extra:
        itype = str(extra["instance_type"])
        put("topology", itype.removeprefix("ml."), "instance_type")
    if "instance_count" in extra:
        put("nodes", _pos_int(extra["instance_count"], where, "instance_count"), "instance_count")
    degrees = {k: smp[k] for k in ("sharded_data_parallel_degree", "hybrid_shard_degree") if k in smp}
    if len(set(map(repr, degrees.values()))) > 1:
        raise ConfigError(f"contradicting shard degrees {degrees}", where=where, field="hybrid_shard_degree")
    pps = {k: smp[k] for k in ("pipeline_parallel_degree", "partitions") if k in smp}
    if len(set(map(repr, pps.values()))) > 1:
        raise ConfigError(f"contradicting pipeline degrees {pps}", where=where, field="partitions")
    if smp.get("tensor_parallel_degree", 1) not in (1, None):
        raise ConfigError("tensor parallelism is not modelled; expected 1", where=where, field="tensor_parallel_degree")
    pp = _pos_int(next(iter(pps.values())), where, next(iter(pps))) if pps else 1
    if pp > 1:
        put("strategy", "pipeline", next(iter(pps)))
        put("pp", pp, next(iter(pps)))
    if degrees:
        key = next(iter(degrees))
        d = _pos_int(degrees[key], where, key)
        if pp == 1:
            # SMP semantics: degree 1 is plain data parallel; the world size is known only
            # later, so zero vs zero2d is settled in `resolve` (zero2d with d = world is zero).
            put("strategy", "ddp" if d == 1 else "zero2d", key)
        put("degree", d, key)
    if "microbatches" in smp:
        put("microbatches", _pos_int(smp["microbatches"], where, "microbatches"), "microbatches")
    if "pipeline" in smp:
        sched = {"simple": "gpipe", "interleaved": "1f1b"}.get(str(smp["pipeline"]))
        if sched is None:
            raise ConfigError(f"expected simple or interleaved, got {smp['pipeline']!r}", where=where, field="pipeline")
        put("schedule", sched, "pipeline")
    if smp.get("ddp") is False and (pp > 1 or degrees):
        pass  # SMP v1 needed ddp: True for data parallelism; shardsim always replicates across the rest
    if smp.get("bf16"):
        put("precision", "bf16", "bf16")
    elif smp.get("fp16"):
        put("precision", "fp16", "fp16")
    if "processes_per_host" in extra:
        values["_processes_per_host"] = _pos_int(extra["processes_per_host"], where, "mpi.processes_per_host")


_FIELDS = (
    "workload",
    "topology",
    "nodes",
    "strategy",
    "degree",
    "pp",
    "microbatches",
    "schedule",
    "batch_per_device",
    "grad_accum",
    "precision",
    "checkpointing",
    "backend",
    "optimizer",
    "profile",
    "seed",
)


def _read_file(path: Path) -> tuple[dict[str, Any], str]:
    where = str(path)
    data = load_yaml(path)
    smp, extra = _smp_parameters(data, where)
    known = set(_FIELDS) | set(_SMP_KEYS) | {"distribution", "instance_type", "instance_count", "name", "description"}
    unknown = sorted(k for k in data if k not in known)
    if unknown:
        raise ConfigError(
            f"unknown key; expected one of {', '.join(_FIELDS)} or SageMaker keys", where=where, field=unknown[0]
        )
    values: dict[str, Any] = {}
    strat = data.get("strategy")
    if isinstance(strat, dict):  # strategy: {kind: zero2d, degree: 4}
        for k, v in strat.items():
            if k not in ("kind", "degree", "pp", "microbatches", "schedule"):
                raise ConfigError("unknown key", where=where, field=f"strategy.{k}")
            values["strategy" if k == "kind" else k] = v
    elif strat is not None:
        values["strategy"] = strat
    for k in _FIELDS:
        if k != "strategy" and k in data and data[k] is not None:
            values[k] = data[k]
    _apply_smp(values, smp, extra, where)
    return values, where


def build_config(values: dict[str, Any], where: str) -> RunConfig:
    """Check field types and ranges and build a RunConfig (cluster-independent checks only)."""
    f = Fields(values, where)
    base = RunConfig()
    kind = f.text("strategy", default=base.strategy.kind, choices=STRATEGIES)
    degree = f.integer("degree", default=0, minimum=1) if f.has("degree") else None
    strategy = Strategy(
        kind=kind,
        degree=degree,
        pp=f.integer("pp", default=1),
        microbatches=f.integer("microbatches", default=1),
        schedule=f.text("schedule", default="1f1b", choices=SCHEDULES),
    )
    if kind != "pipeline" and strategy.pp > 1:
        raise ConfigError(f"pp={strategy.pp} needs strategy pipeline, got {kind}", where=where, field="pp")
    if kind == "ddp" and degree not in (None, 1):
        raise ConfigError(
            f"ddp replicates the model; a shard degree of {degree} contradicts it", where=where, field="degree"
        )
    if kind == "zero2d" and degree is None:
        raise ConfigError("zero2d needs a degree (the partition group size)", where=where, field="degree")
    # Without a node count: the seed's 8 nodes on the default topology; otherwise the
    # topology decides (an emulated cluster has its own count, an instance type gives 1).
    if "nodes" in values:
        nodes: int | None = f.integer("nodes")
    else:
        nodes = base.nodes if "topology" not in values else None
    profile = values.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ConfigError(f"expected a file path, got {profile!r}", where=where, field="profile")
    return RunConfig(
        workload=f.text("workload", default=base.workload),
        topology=f.text("topology", default=base.topology),
        nodes=nodes,
        strategy=strategy,
        batch_per_device=f.integer("batch_per_device", default=base.batch_per_device),
        grad_accum=f.integer("grad_accum", default=base.grad_accum),
        precision=f.text("precision", default=base.precision, choices=PRECISIONS),
        checkpointing=f.boolean("checkpointing", default=base.checkpointing),
        backend=f.text("backend", default=base.backend, choices=BACKENDS),
        optimizer=f.text("optimizer", default=base.optimizer, choices=("adam",)),
        profile=profile,
        seed=f.integer("seed", default=0, minimum=0),
        source=where,
    )


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a config file (optional), apply flag overrides (None values ignored), check it."""
    values: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        values, where = _read_file(Path(path))
    for k, v in (overrides or {}).items():
        if v is not None:
            values[k] = v
    values.pop("_processes_per_host", None)
    if overrides and any(v is not None for v in overrides.values()):
        where = f"{where} + flags" if path is not None else "flags"
    return build_config(values, where)


def resolve(cfg: RunConfig, world: int, n_blocks: int) -> tuple[RunConfig, Resolved]:
    """Check the configuration against the world size and the model; settle defaults.

    Returns the normalized config (zero's degree = world; SMP's degree = world → zero) and
    the derived sizes. Raises ConfigError with one clear line when something does not fit.
    """
    s = cfg.strategy
    where = cfg.source
    if s.kind in ("zero", "zero2d", "ddp") and s.pp != 1:
        raise ConfigError(f"pp={s.pp} needs strategy pipeline", where=where, field="pp")
    pp = s.pp if s.kind == "pipeline" else 1
    if pp > world or world % pp:
        raise ConfigError(f"pipeline degree {pp} does not divide the world size {world}", where=where, field="pp")
    if pp > n_blocks:
        raise ConfigError(f"pipeline degree {pp} exceeds the model's {n_blocks} blocks", where=where, field="pp")
    replicas_all = world // pp
    if s.kind == "ddp":
        shard = 1
    elif s.kind == "zero":
        if s.degree not in (None, world):
            raise ConfigError(
                f"zero shards over the whole world ({world}); degree {s.degree} contradicts it (use zero2d)",
                where=where,
                field="degree",
            )
        shard = world
    elif s.kind == "zero2d":
        shard = s.degree or world
    else:
        shard = s.degree or 1
    if shard > replicas_all or replicas_all % shard:
        span = "the world size" if pp == 1 else f"the {replicas_all} ranks of a pipeline stage"
        raise ConfigError(f"degree {shard} does not divide {span} {replicas_all}", where=where, field="degree")
    kind = s.kind
    if kind == "zero2d" and shard == world:
        kind = "zero"  # MiCS with one partition group is plain ZeRO-3
    strategy = replace(s, kind=kind, degree=shard if kind in ("zero", "zero2d", "pipeline") else None, pp=pp)
    if kind != "pipeline":
        strategy = replace(strategy, microbatches=1)
    m = strategy.microbatches
    per_replica = cfg.batch_per_device * pp  # a pipeline replica takes the batch of its pp devices
    if kind == "pipeline" and per_replica % m:
        raise ConfigError(
            f"{m} microbatches do not divide the per-replica batch {per_replica} "
            f"(batch_per_device {cfg.batch_per_device} x pp {pp})",
            where=where,
            field="microbatches",
        )
    mbs = per_replica // m if kind == "pipeline" else cfg.batch_per_device
    res = Resolved(
        world=world,
        shard=shard,
        replicas=replicas_all // shard,
        pp=pp,
        microbatches=m,
        microbatch_size=mbs,
        global_batch=cfg.batch_per_device * world * cfg.grad_accum,
    )
    return replace(cfg, strategy=strategy), res


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by predict, run, sweep; each overrides the same key of the YAML file."""
    p.add_argument("config", nargs="?", help="YAML config file (flags override it)")
    p.add_argument("--workload", help="preset name or pkg.module:build_fn")
    p.add_argument("--topology", help="instance type name (e.g. p4d.24xlarge) or a YAML path")
    p.add_argument("--nodes", type=int, help="number of nodes (instances)")
    p.add_argument("--strategy", choices=STRATEGIES)
    p.add_argument("--degree", type=int, help="sharded data parallel degree (partition group size)")
    p.add_argument("--pp", type=int, help="pipeline stages")
    p.add_argument("--microbatches", type=int)
    p.add_argument("--schedule", choices=SCHEDULES)
    p.add_argument("--batch-per-device", type=int, dest="batch_per_device")
    p.add_argument("--grad-accum", type=int, dest="grad_accum")
    p.add_argument("--precision", choices=PRECISIONS)
    p.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--backend", choices=BACKENDS)
    p.add_argument("--profile", help="measured profile file (shardsim profile)")
    p.add_argument("--seed", type=int)


def config_from_args(ns: argparse.Namespace) -> RunConfig:
    overrides = {k: getattr(ns, k, None) for k in _FIELDS if k not in ("optimizer",)}
    return load_config(ns.config, overrides)
