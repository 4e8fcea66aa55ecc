"""SageMaker model-parallel keys, as users paste them, translated into shardsim's fields.

Flat (``sharded_data_parallel_degree: 32``) or the whole ``distribution`` block of a PyTorch
estimator, with ``instance_type`` and ``instance_count``; contradictions are refused.
"""

from __future__ import annotations

from typing import Any

from shardsim.simulator.errors import ConfigError

SMP_KEYS = (
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


def smp_parameters(data: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
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
    for key in SMP_KEYS:
        if key in data:
            smp[key] = data[key]
    for key in ("instance_type", "instance_count"):
        if key in data:
            extra[key] = data[key]
    return smp, extra


def pos_int(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"expected an integer >= 1, got {value!r}", where=where, field=name)
    return value


def apply_smp(values: dict[str, Any], smp: dict[str, Any], extra: dict[str, Any], where: str) -> None:
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
        put("nodes", pos_int(extra["instance_count"], where, "instance_count"), "instance_count")
    degrees = {k: smp[k] for k in ("sharded_data_parallel_degree", "hybrid_shard_degree") if k in smp}
    if len(set(map(repr, degrees.values()))) > 1:
        raise ConfigError(f"contradicting shard degrees {degrees}", where=where, field="hybrid_shard_degree")
    pps = {k: smp[k] for k in ("pipeline_parallel_degree", "partitions") if k in smp}
    if len(set(map(repr, pps.values()))) > 1:
        raise ConfigError(f"contradicting pipeline degrees {pps}", where=where, field="partitions")
    if smp.get("tensor_parallel_degree", 1) not in (1, None):
        raise ConfigError("tensor parallelism is not modelled; expected 1", where=where, field="tensor_parallel_degree")
    pp = pos_int(next(iter(pps.values())), where, next(iter(pps))) if pps else 1
    if pp > 1:
        put("strategy", "pipeline", next(iter(pps)))
        put("pp", pp, next(iter(pps)))
    if degrees:
        key = next(iter(degrees))
        d = pos_int(degrees[key], where, key)
        if pp == 1:
            # SMP semantics: degree 1 is plain data parallel; the world size is known only
            # later, so zero vs zero2d is settled in `resolve` (zero2d with d = world is zero).
            put("strategy", "ddp" if d == 1 else "zero2d", key)
        put("degree", d, key)
    if "microbatches" in smp:
        put("microbatches", pos_int(smp["microbatches"], where, "microbatches"), "microbatches")
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
        values["_processes_per_host"] = pos_int(extra["processes_per_host"], where, "mpi.processes_per_host")
