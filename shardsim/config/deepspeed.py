"""DeepSpeed's ``zero_optimization`` block, as users paste it from a DeepSpeed config (or a Hugging
Face Trainer's), translated into shardsim's fields where SageMaker's `distribution` blocks are
read (`load`): the keys DeepSpeed's `DeepSpeedZeroConfig` defines, each modelled, accepted with
a stated note (logged once, one line a key), or refused; any other key is refused.

Modelled: the block sets ``library: deepspeed`` (DeepSpeed's own ZeRO:
`simulator.strategies.deepspeed_zero`); ``stage`` (0 → ddp, 1 → zero1, 2 → zero with
reshard_after_forward false, 3 → zero: the kinds DeepSpeed's stages are planned under);
``mics_shard_size`` (> 0, stage 3: zero2d with that degree); ``mics_hierarchical_params_gather``
(true: MiCS's two-hop all-gather across nodes, which library smp models, so library smp); the
bucket sizes, switches and stage-3 limits of `COUNTS` and `SWITCHES` (the ``deepspeed`` key,
`DeepSpeedSettings`). `DEEPSPEED_NOTES` are accepted and not modelled, each with why; `REFUSED` are
refused unless off (their off value, as DeepSpeed's default, is what the simulator models).
"""

from __future__ import annotations

from typing import Any

from shardsim.config.smp import _put
from shardsim.core.errors import ConfigError
from shardsim.core.notes import not_modelled
from shardsim.core.yamlio import check_keys
from shardsim.specs.strategies import DDP, ZERO, ZERO1, ZERO2D

ZERO_OPTIMIZATION = "zero_optimization"
DEEPSPEED_KEYS = (ZERO_OPTIMIZATION,)  # a configuration file's keys this module reads
# stage → (kind, reshard_after_forward)
STAGES = {0: (DDP.name, True), 1: (ZERO1.name, True), 2: (ZERO.name, False), 3: (ZERO.name, True)}
# DeepSpeed's knobs that library deepspeed plans with (`DeepSpeedSettings`), each a count or a switch
COUNTS = (
    "reduce_bucket_size",
    "allgather_bucket_size",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
)
SWITCHES = ("overlap_comm", "contiguous_gradients", "reduce_scatter", "use_multi_rank_bucket_allreduce")
MODELLED = ("stage", "mics_shard_size", "mics_hierarchical_params_gather", *COUNTS, *SWITCHES)
AUTO = "auto"  # the Hugging Face Trainer's placeholder in a ds_config
_AUTO = "auto: DeepSpeed's default is predicted (the Trainer fills it from the model)"
_SMP_PLANS = "library smp (MiCS's hierarchical all-gather) plans its own collectives"
_STAGE0 = "stage 0 is planned as PyTorch's DDP (its buckets, fp32 gradients)"

_STAGE3 = (
    "not modelled: the plan fetches each parameter tensor as a module of its own, in one all_gather_coalesced "
    "(DeepSpeed's defaults)"
)
_SAVE = "checkpoint saving and loading are not part of a training step"
DEEPSPEED_NOTES = {
    "allgather_partitions": "updated partitions are all-gathered (DeepSpeed's default)",
    "round_robin_gradients": "a CPU-offload optimization; offload is refused",
    "sub_group_size": "the optimizer step is modelled over the rank's whole partition",
    "load_from_fp32_weights": _SAVE,
    "elastic_checkpoint": _SAVE,
    "stage3_gather_16bit_weights_on_model_save": _SAVE,
    "stage3_gather_fp16_weights_on_model_save": _SAVE,
    "pipeline_loading_checkpoint": _SAVE,
    "stage3_model_persistence_threshold": _STAGE3,
    "stage3_module_granularity_threshold": _STAGE3,
    "stage3_use_all_reduce_for_fetch_params": _STAGE3,
    "stage3_allgather_sequential": _STAGE3,
    "leaf_module": _STAGE3,
    "memory_efficient_linear": "activation memory of Linear layers is modelled as PyTorch's",
    "ignore_unused_parameters": "every parameter of a shardsim model is used",
    "legacy_stage1": "stage 1 is modelled as DeepSpeed's current one (stage_1_and_2.py)",
    "cpu_offload_use_pin_memory": "applies to offload, which is refused",
    "log_trace_cache_warnings": "logging only",
    "enable_sanity_checks": "debugging only",
}
# refused unless off: (what it does, its off values)
REFUSED = {
    "offload_optimizer": ("CPU / NVMe offload of the optimizer", ("none", None)),
    "offload_param": ("CPU / NVMe offload of the parameters", ("none", None)),
    "cpu_offload": ("CPU offload of the optimizer", (False, None)),
    "cpu_offload_param": ("CPU offload of the parameters", (False, None)),
    "zero_hpz_partition_size": ("ZeRO++'s secondary (hpZ) partition", (0, 1)),
    "zero_quantized_weights": ("ZeRO++'s quantized all-gather (qwZ)", (False,)),
    "zero_quantized_nontrainable_weights": ("ZeRO++'s quantized frozen weights", (False,)),
    "zero_quantized_gradients": ("ZeRO++'s quantized gradients (qgZ)", (False,)),
    "zeropp_loco_param": ("LoCo-ZeRO++", (None,)),
    "zenflow": ("ZenFlow", (None,)),
}
ZERO_KEYS = (*MODELLED, *DEEPSPEED_NOTES, *REFUSED)
# the keys of an offload block (DeepSpeed's DeepSpeedZeroOffloadOptimizerConfig and ...ParamConfig)
OFFLOAD_KEYS = {
    "offload_optimizer": (
        "device",
        "nvme_path",
        "buffer_count",
        "pin_memory",
        "pipeline_read",
        "pipeline_write",
        "fast_init",
        "ratio",
    ),
    "offload_param": ("device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"),
}
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
_OFFLOAD_OFF = "applies to offload, which is off (device none)"


def _int(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"expected an integer, got {value!r}", where=where, field=name)
    return value


def _bool(value: Any, where: str, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"expected true or false, got {value!r}", where=where, field=name)
    return value


def _count(value: Any, where: str, name: str) -> int:
    """A size as DeepSpeed reads it: an integer >= 0, also written as a whole float (``5e8``)."""
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"expected an integer >= 0, got {value!r}", where=where, field=name)
    return value


def zero_settings(block: dict[str, Any], where: str) -> dict[str, Any]:
    """The `DeepSpeedSettings` fields `block` gives (its `COUNTS` and `SWITCHES`), checked; a
    value ``auto`` (a Hugging Face Trainer fills it) is noted and left at DeepSpeed's default."""
    out: dict[str, Any] = {}
    for key in (*COUNTS, *SWITCHES):
        name = f"{ZERO_OPTIMIZATION}.{key}"
        if key not in block:
            continue
        if block[key] == AUTO:
            not_modelled(where, name, _AUTO)
        else:
            out[key] = _count(block[key], where, name) if key in COUNTS else _bool(block[key], where, name)
    return out


def merge_settings(values: dict[str, Any], settings: dict[str, Any], where: str) -> None:
    """Add `settings` to the ``deepspeed`` mapping of `values` (the file's own, where it gave one)."""
    given = values.get("deepspeed", {})
    if not isinstance(given, dict):
        raise ConfigError(f"expected a mapping, got {given!r}", where=where, field="deepspeed")
    values["deepspeed"] = {**given, **settings}


def _offload_device(block: dict[str, Any], key: str, where: str) -> Any:
    """The ``device`` of the offload block `key` (none where absent), every key of the block
    one DeepSpeed defines there; the others of a block that is off are noted."""
    value = block[key]
    if not isinstance(value, dict):
        return value
    name = f"{ZERO_OPTIMIZATION}.{key}"
    check_keys(value, OFFLOAD_KEYS[key], where=where, prefix=f"{name}.")
    device = value.get("device", "none")
    if device not in OFFLOAD_DEVICES:
        raise ConfigError(
            f"expected one of {', '.join(OFFLOAD_DEVICES)}, got {device!r}", where=where, field=f"{name}.device"
        )
    if device == "none":
        for inner in value:
            if inner != "device":
                not_modelled(where, f"{name}.{inner}", _OFFLOAD_OFF)
    return device


def _refuse_enabled(block: dict[str, Any], where: str) -> None:
    """Refuse a `REFUSED` key that is on (an offload's ``device`` other than none)."""
    for key, (what, off) in REFUSED.items():
        if key not in block:
            continue
        value = _offload_device(block, key, where) if key in OFFLOAD_KEYS else block[key]
        if value not in off:
            raise ConfigError(
                f"{what} is not modelled; remove it or set it off", where=where, field=f"{ZERO_OPTIMIZATION}.{key}"
            )


def apply_deepspeed(values: dict[str, Any], data: dict[str, Any], where: str) -> None:
    """Translate a ``zero_optimization`` block of `data` into `values`, refusing contradictions
    with keys given elsewhere (`smp._put`); the accepted, unmodelled keys it holds are logged."""
    block = data.get(ZERO_OPTIMIZATION)
    if block is None:
        return
    if not isinstance(block, dict):
        raise ConfigError(f"expected a mapping, got {block!r}", where=where, field=ZERO_OPTIMIZATION)
    check_keys(block, ZERO_KEYS, where=where, prefix=f"{ZERO_OPTIMIZATION}.")
    _refuse_enabled(block, where)
    name = f"{ZERO_OPTIMIZATION}.stage"
    stage = _int(block.get("stage", 0), where, name)  # DeepSpeed's default: 0, disabled
    if stage not in STAGES:
        raise ConfigError(f"expected 0, 1, 2 or 3, got {stage}", where=where, field=name)
    kind, reshard = STAGES[stage]
    mics_name = f"{ZERO_OPTIMIZATION}.mics_shard_size"
    mics = _int(block.get("mics_shard_size", -1), where, mics_name)
    hier_name = f"{ZERO_OPTIMIZATION}.mics_hierarchical_params_gather"
    hierarchical = _bool(block.get("mics_hierarchical_params_gather", False), where, hier_name)
    if mics > 0:
        if stage != 3:
            raise ConfigError(f"MiCS shards parameters: it needs stage 3, got {stage}", where=where, field=mics_name)
        kind = ZERO2D.name
        _put(values, "degree", mics, mics_name, where)
    elif hierarchical:
        raise ConfigError("applies to MiCS: set mics_shard_size > 0", where=where, field=hier_name)
    settings = zero_settings(block, where)
    _put(values, "library", "smp" if hierarchical else "deepspeed", name, where)  # smp: MiCS's hierarchical gather
    _put(values, "strategy", kind, name, where)
    if not reshard:
        _put(values, "reshard_after_forward", False, name, where)
    if hierarchical:
        for key in settings:
            not_modelled(where, f"{ZERO_OPTIMIZATION}.{key}", _SMP_PLANS)
    elif settings:
        merge_settings(values, settings, where)
    if stage == 0:
        not_modelled(where, name, _STAGE0)
    for key in block:
        if key in DEEPSPEED_NOTES:
            not_modelled(where, f"{ZERO_OPTIMIZATION}.{key}", DEEPSPEED_NOTES[key])
