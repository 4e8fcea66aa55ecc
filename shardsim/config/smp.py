"""SageMaker model-parallel keys and FSDP's own, as users paste them, translated into shardsim's fields.

SageMaker's flat (``sharded_data_parallel_degree: 32``) or the whole ``distribution`` block of a
PyTorch estimator, with ``instance_type`` and ``instance_count``; FSDP's ``sharding_strategy``
and ``mixed_precision: {param_dtype, reduce_dtype}`` (``param_dtype`` and dtype names such as
``torch.bfloat16`` also flat); contradictions are refused (``bf16`` and ``fp16`` both true among
them). A key at any level of the block that SageMaker does not define there is refused, and so
are parameters under ``enabled: false`` (SageMaker would not apply them); the keys accepted and
not modelled (`SMP_NOTES`, `LAUNCHER_NOTES`) are noted on stderr, one line each.
"""

from __future__ import annotations

from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.core.notes import not_modelled
from shardsim.core.yamlio import check_keys
from shardsim.specs.strategies import DDP, FSDP_SHARDING, PIPELINE, ZERO, ZERO2D

SMP_KEYS = (
    "sharded_data_parallel_degree",
    "hybrid_shard_degree",
    "pipeline_parallel_degree",
    "partitions",
    "microbatches",
    "ddp",
    "pipeline",
    "tensor_parallel_degree",
    "context_parallel_degree",
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

_PARTITION = "pipeline stages split the layers evenly (SMP's partitioning is not modelled)"
SMP_NOTES = {  # parameters accepted, not modelled: why
    "ddp": "the ranks beside the model-parallel groups always replicate the model (data parallelism)",
    "delayed_parameter_initialization": "initialization is not part of a training step",
    "placement_strategy": "the ranks are placed by mesh_order",
    "optimize": _PARTITION,
    "auto_partition": _PARTITION,
    "default_partition": _PARTITION,
    "activation_loading_horizon": "activation offloading is not modelled",
    "sharded_data_parallel_degree_pipeline": "a pipeline's stages are sharded by degree",
}
LAUNCHER_NOTES = {  # the `mpi` and `torch_distributed` launchers' keys
    "enabled": "the launcher is not part of a training step",
    "processes_per_host": "each of a node's GPUs runs one rank (gpus_per_node sets how many)",
    "custom_mpi_options": "the launcher is not part of a training step",
}
assert set(SMP_NOTES) <= set(SMP_KEYS)

FSDP_KEYS = ("sharding_strategy", "mixed_precision", "param_dtype")
MIXED_PRECISION = ("param_dtype", "reduce_dtype")  # FSDP1's MixedPrecision, FSDP2's MixedPrecisionPolicy
_CASTS = "the casts of a module's inputs and outputs are not modelled"
MIXED_PRECISION_NOTES = {
    "buffer_dtype": "module buffers are not modelled",
    "keep_low_precision_grads": "gradients are held in reduce_dtype",
    "cast_forward_inputs": _CASTS,
    "cast_root_forward_inputs": _CASTS,
    "output_dtype": _CASTS,
}
# a PyTorch estimator's keys beside its parameters: the `distribution` block and the cluster
SAGEMAKER_CLUSTER_KEYS = ("distribution", "instance_type", "instance_count")
# FSDP1's ShardingStrategy (FSDP2: reshard_after_forward) → (kind, reshard_after_forward)
SHARDING_STRATEGIES = FSDP_SHARDING
DTYPE_NAMES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def dtype_name(value: Any, where: str, name: str) -> str:
    """fp32 | fp16 | bf16, also spelled as torch names (``torch.bfloat16``, ``float32``)."""
    text = str(value).removeprefix("torch.") if isinstance(value, str) else ""
    text = DTYPE_NAMES.get(text, text)
    if text not in ("fp32", "fp16", "bf16"):
        raise ConfigError(f"expected fp32, fp16 or bf16 (or torch's names), got {value!r}", where=where, field=name)
    return text


def _put(values: dict[str, Any], key: str, value: Any, origin: str, where: str) -> None:
    if key in values and values[key] != value:
        raise ConfigError(
            f"contradicts {key}={values[key]!r} given elsewhere ({origin} gives {value!r})", where=where, field=origin
        )
    values[key] = value


def apply_fsdp_keys(values: dict[str, Any], data: dict[str, Any], where: str) -> None:
    """FSDP's ``sharding_strategy`` and mixed-precision keys, refusing contradictions.
    HYBRID_SHARD without a degree shards within each node, as FSDP1 does by default (`resolve`
    settles the degree to the node's data-parallel ranks)."""
    if "sharding_strategy" in data:
        raw = data["sharding_strategy"]
        key = str(raw).removeprefix("ShardingStrategy.") if isinstance(raw, str) else ""
        if key not in SHARDING_STRATEGIES:
            raise ConfigError(
                f"expected one of {', '.join(SHARDING_STRATEGIES)}, got {raw!r}", where=where, field="sharding_strategy"
            )
        kind, reshard = SHARDING_STRATEGIES[key]
        if values.get("strategy") == ZERO2D.name and kind == ZERO.name:
            kind = ZERO2D.name  # a SageMaker degree below the world with FULL_SHARD: hybrid, as SMP shards it
        _put(values, "strategy", kind, "sharding_strategy", where)
        if not reshard:
            _put(values, "reshard_after_forward", False, "sharding_strategy", where)
    mp = data.get("mixed_precision")
    if mp is not None and not isinstance(mp, dict):
        raise ConfigError("expected a mapping {param_dtype, reduce_dtype}", where=where, field="mixed_precision")
    mp = dict(mp or {})
    check_keys(mp, (*MIXED_PRECISION, *MIXED_PRECISION_NOTES), where=where, prefix="mixed_precision.")
    for key in mp:
        if key in MIXED_PRECISION_NOTES:
            not_modelled(where, f"mixed_precision.{key}", MIXED_PRECISION_NOTES[key])
    if "param_dtype" in data:
        if "param_dtype" in mp and mp["param_dtype"] != data["param_dtype"]:
            why = f"disagrees with {mp['param_dtype']!r} in mixed_precision; give it once"
            raise ConfigError(why, where=where, field="param_dtype")
        mp["param_dtype"] = data["param_dtype"]
    if "param_dtype" in mp:
        _put(values, "precision", dtype_name(mp["param_dtype"], where, "param_dtype"), "param_dtype", where)
    if "reduce_dtype" in mp:
        reduce = dtype_name(mp["reduce_dtype"], where, "mixed_precision.reduce_dtype")
        _put(values, "reduce_dtype", reduce, "mixed_precision.reduce_dtype", where)
    if isinstance(values.get("reduce_dtype"), str):  # torch's names for the flat key too
        values["reduce_dtype"] = dtype_name(values["reduce_dtype"], where, "reduce_dtype")


# The keys of a PyTorch estimator's `distribution` block that shardsim reads, level by level
DISTRIBUTION = "distribution"
DISTRIBUTION_KEYS = ("smdistributed", "mpi", "torch_distributed")
SMDISTRIBUTED_KEYS = ("modelparallel",)
MODELPARALLEL_KEYS = ("enabled", "parameters")
LAUNCHER_KEYS = tuple(LAUNCHER_NOTES)  # mpi, torch_distributed


def _block(parent: dict[str, Any], key: str, keys: tuple[str, ...], where: str, name: str) -> dict[str, Any]:
    """`parent[key]` as a mapping holding only `keys` ({} when absent); ConfigError naming `name`."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"expected a mapping, got {value!r}", where=where, field=name)
    check_keys(value, keys, where=where, prefix=f"{name}.")
    return value


def smp_parameters(data: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pull SageMaker keys out of a mapping: flat, or from a pasted `distribution` block (every
    level of it closed to the keys SageMaker defines there and shardsim reads)."""
    smp: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    dist = _block(data, DISTRIBUTION, DISTRIBUTION_KEYS, where, DISTRIBUTION)
    sm_name = f"{DISTRIBUTION}.smdistributed"
    mp_name = f"{sm_name}.modelparallel"
    mp = _block(
        _block(dist, "smdistributed", SMDISTRIBUTED_KEYS, where, sm_name),
        "modelparallel",
        MODELPARALLEL_KEYS,
        where,
        mp_name,
    )
    params = _block(mp, "parameters", SMP_KEYS, where, f"{mp_name}.parameters")
    enabled = mp.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"expected true or false, got {enabled!r}", where=where, field=f"{mp_name}.enabled")
    if params and not enabled:
        raise ConfigError(
            "model parallelism is disabled, so its parameters would not apply; set it true or remove them",
            where=where,
            field=f"{mp_name}.enabled",
        )
    smp.update(params)
    if params:
        extra["library"] = "smp"  # SageMaker's model-parallel library runs these collectives
    for launcher in ("mpi", "torch_distributed"):
        name = f"{DISTRIBUTION}.{launcher}"
        block = _block(dist, launcher, LAUNCHER_KEYS, where, name)
        if "processes_per_host" in block:
            extra.setdefault("processes_per_host", block["processes_per_host"])
        for key in block:
            not_modelled(where, f"{name}.{key}", LAUNCHER_NOTES[key])
    for key in SMP_KEYS:
        if key in data:
            if key in smp and smp[key] != data[key]:
                why = f"disagrees with {smp[key]!r} in {mp_name}.parameters; give it once"
                raise ConfigError(why, where=where, field=key)
            smp[key] = data[key]
    for key in ("instance_type", "instance_count"):
        if key in data:
            extra[key] = data[key]
    return smp, extra


def pos_int(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"expected an integer >= 1, got {value!r}", where=where, field=name)
    return value


def _flag(value: Any, where: str, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"expected true or false, got {value!r}", where=where, field=name)
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
    if "library" in extra:
        put("library", extra["library"], DISTRIBUTION)
    if "instance_count" in extra:
        put("nodes", pos_int(extra["instance_count"], where, "instance_count"), "instance_count")
    degrees = {k: smp[k] for k in ("sharded_data_parallel_degree", "hybrid_shard_degree") if k in smp}
    if len(set(map(repr, degrees.values()))) > 1:
        raise ConfigError(f"contradicting shard degrees {degrees}", where=where, field="hybrid_shard_degree")
    pps = {k: smp[k] for k in ("pipeline_parallel_degree", "partitions") if k in smp}
    if len(set(map(repr, pps.values()))) > 1:
        raise ConfigError(f"contradicting pipeline degrees {pps}", where=where, field="partitions")
    if smp.get("tensor_parallel_degree") is not None:
        put("tp", pos_int(smp["tensor_parallel_degree"], where, "tensor_parallel_degree"), "tensor_parallel_degree")
    if smp.get("context_parallel_degree") is not None:
        put("cp", pos_int(smp["context_parallel_degree"], where, "context_parallel_degree"), "context_parallel_degree")
    pp = pos_int(next(iter(pps.values())), where, next(iter(pps))) if pps else 1
    if pp > 1:
        put("strategy", PIPELINE.name, next(iter(pps)))
        put("pp", pp, next(iter(pps)))
    if degrees:
        key = next(iter(degrees))
        d = pos_int(degrees[key], where, key)
        if pp == 1:
            # SMP semantics: degree 1 is plain data parallel; the world size is known only
            # later, so zero vs zero2d is settled in `resolve` (zero2d with d = world is zero).
            put("strategy", DDP.name if d == 1 else ZERO2D.name, key)
        put("degree", d, key)
    if "microbatches" in smp:
        put("microbatches", pos_int(smp["microbatches"], where, "microbatches"), "microbatches")
    if "pipeline" in smp:
        sched = {"simple": "gpipe", "interleaved": "1f1b"}.get(str(smp["pipeline"]))
        if sched is None:
            raise ConfigError(f"expected simple or interleaved, got {smp['pipeline']!r}", where=where, field="pipeline")
        put("schedule", sched, "pipeline")
    halves = [k for k in ("bf16", "fp16") if k in smp and _flag(smp[k], where, k)]
    if len(halves) > 1:
        raise ConfigError("bf16 and fp16 are both true; set one of them", where=where, field="fp16")
    if halves:
        put("precision", halves[0], halves[0])
    for key in smp:
        if key in SMP_NOTES:
            not_modelled(where, key, SMP_NOTES[key])
    if "processes_per_host" in extra:
        values["_processes_per_host"] = pos_int(extra["processes_per_host"], where, "mpi.processes_per_host")
