"""A whole DeepSpeed config (``ds_config.json``) read as a configuration file: its top-level keys
(deepspeed/runtime/config.py, constants.py), each modelled, accepted with a note that it does not
change the model (one line a key, `notes.not_modelled`), or refused where it is on; its
``zero_optimization`` block is `deepspeed`'s.

Modelled: ``train_micro_batch_size_per_gpu`` → batch_per_device, ``gradient_accumulation_steps``
→ grad_accum, ``train_batch_size`` (checked against both and the data-parallel ranks once the
world is known: `check_train_batch`), ``fp16`` / ``bf16`` (``bfloat16``) blocks' ``enabled`` →
precision (`precision_blocks`, read as SageMaker's flat ``fp16`` / ``bf16``),
``optimizer.type`` → optimizer (DeepSpeed's FusedAdam for Adam and AdamW: optimizer_impl fused),
``communication_data_type`` → reduce_dtype. A value ``auto`` (a Hugging Face Trainer fills it) is
noted and left to the configuration's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.config.deepspeed import AUTO, merge_settings
from shardsim.config.smp import _put, pos_int
from shardsim.core.errors import ConfigError
from shardsim.core.notes import not_modelled

if TYPE_CHECKING:
    from shardsim.config.schema import RunConfig

HALVES = {"fp16": "fp16", "bf16": "bf16", "bfloat16": "bf16"}  # DeepSpeed's precision blocks
# DeepSpeed's optimizer types (`_configure_basic_optimizer`; others by torch.optim's name) → shardsim's
OPTIMIZERS = {"adam": "adam", "adamw": "adamw", "lamb": "lamb", "sgd": "sgd", "adafactor": "adafactor"}
FUSED = ("adam", "adamw")  # DeepSpeed builds FusedAdam for these (multi-tensor apply over the partition)
COMM_DTYPES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "bfp16": "bf16"}
_LOGGING = "logging and monitoring are not part of a training step"
_STEP = "does not change a step's time or memory in the model"
NOTES = {
    "scheduler": "the learning-rate schedule does not change a step's time or memory",
    "gradient_clipping": "the gradient norm (a reduction over the partition and one all-reduce) is not modelled",
    "prescale_gradients": _STEP,
    "gradient_predivide_factor": _STEP,
    "steps_per_print": _LOGGING,
    "wall_clock_breakdown": _LOGGING,
    "memory_breakdown": _LOGGING,
    "dump_state": _LOGGING,
    "flops_profiler": _LOGGING,
    "comms_logger": _LOGGING,
    "tensorboard": _LOGGING,
    "wandb": _LOGGING,
    "csv_monitor": _LOGGING,
    "comet": _LOGGING,
    "timers": _LOGGING,
    "checkpoint": "checkpoint saving and loading are not part of a training step",
    "zero_allow_untested_optimizer": _STEP,
    "zero_force_ds_cpu_optimizer": "applies to offload, which is refused",
    "dataloader_drop_last": _STEP,
    "sparse_gradients": "every gradient of a shardsim model is dense",
    "activation_checkpointing": "applies where the model calls deepspeed.checkpointing; the checkpointing "
    "setting says what is recomputed",
    "seq_parallel_communication_data_type": "applies to DeepSpeed-Ulysses, which is not modelled",
    "autotuning": "the autotuner chooses a configuration; this one is predicted as given",
}
# refused where on: (what it is, its off test)
REFUSED = {
    "amp": "NVIDIA apex's AMP",
    "torch_autocast": "DeepSpeed's torch.autocast mode",
    "sparse_attention": "DeepSpeed's sparse attention",
    "progressive_layer_drop": "progressive layer drop",
    "curriculum_learning": "curriculum learning",
    "data_efficiency": "data efficiency (sampling, routing)",
    "compression_training": "compression training",
    "eigenvalue": "the eigenvalue computation",
    "hybrid_engine": "the hybrid engine",
    "elasticity": "elastic training",
}
BATCH_KEYS = {"train_micro_batch_size_per_gpu": "batch_per_device", "gradient_accumulation_steps": "grad_accum"}
MODELLED = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "communication_data_type",
)
# a file's keys this module reads besides "optimizer" (a setting's name: its mapping is DeepSpeed's)
# and "fp16", "bf16" (SageMaker's switches: `precision_blocks`)
DS_CONFIG_KEYS = (*MODELLED, *NOTES, *REFUSED, "bfloat16")


def _off(value: Any) -> bool:
    """Whether a block is off: absent, false or ``{enabled: false}`` (the only way DeepSpeed turns one off)."""
    if isinstance(value, dict):
        return value.get("enabled", False) is False
    return value is None or value is False


def precision_blocks(data: dict[str, Any], where: str) -> dict[str, Any]:
    """`data` with DeepSpeed's ``fp16`` / ``bf16`` / ``bfloat16`` blocks as SageMaker's flat
    switches (``fp16: true``): ``enabled`` read, the block's other keys (loss scaling, master
    weights) noted; ``auto`` left to the configuration's precision."""
    out = dict(data)
    for key, name in HALVES.items():
        block = data.get(key)
        if not isinstance(block, dict):
            continue
        del out[key]
        enabled = block.get("enabled", False)
        for inner in block:
            if inner != "enabled":
                not_modelled(where, f"{key}.{inner}", "loss scaling and master-weight options are not modelled")
        if enabled == AUTO:
            not_modelled(where, f"{key}.enabled", "auto: the configuration's precision is predicted")
            continue
        if not isinstance(enabled, bool):
            raise ConfigError(f"expected true, false or auto, got {enabled!r}", where=where, field=f"{key}.enabled")
        if key == "bfloat16" and "bf16" in data:
            raise ConfigError("given beside bf16; give one of them", where=where, field=key)
        if enabled or name not in out:
            out[name] = enabled
    return out


def _given(data: dict[str, Any], key: str, where: str) -> Any:
    """`data`'s `key`, None where absent or ``auto`` (noted)."""
    value = data.get(key)
    if value == AUTO:
        not_modelled(where, key, "auto: the configuration's value is predicted")
        return None
    return value


def _optimizer(values: dict[str, Any], block: Any, where: str) -> None:
    if not isinstance(block, dict):
        raise ConfigError(
            f"expected a mapping {{type: ..., params: ...}}, got {block!r}", where=where, field="optimizer"
        )
    for inner in block:
        if inner not in ("type", "params"):
            not_modelled(where, f"optimizer.{inner}", _STEP)
    kind = block.get("type")
    name = OPTIMIZERS.get(kind.lower()) if isinstance(kind, str) else None
    if name is None:
        expected = "Adam, AdamW, Lamb, SGD or Adafactor"
        raise ConfigError(f"expected {expected}, got {kind!r}", where=where, field="optimizer.type")
    _put(values, "optimizer", name, "optimizer.type", where)
    if name in FUSED:
        _put(values, "optimizer_impl", "fused", "optimizer.type", where)
    if "params" in block:
        not_modelled(where, "optimizer.params", "hyperparameters do not change a step's time or memory")


def apply_ds_config(values: dict[str, Any], data: dict[str, Any], where: str) -> None:
    """Translate a ds_config's top-level keys of `data` into `values` (contradictions refused,
    `smp._put`); the accepted, unmodelled keys it holds are noted."""
    for key, what in REFUSED.items():
        if key in data and not _off(data[key]):
            raise ConfigError(f"{what} is not modelled; remove it or set it off", where=where, field=key)
    for key, field in BATCH_KEYS.items():
        value = _given(data, key, where)
        if value is not None:
            _put(values, field, pos_int(value, where, key), key, where)
    total = _given(data, "train_batch_size", where)
    if total is not None:
        merge_settings(values, {"train_batch_size": pos_int(total, where, "train_batch_size")}, where)
    if isinstance(data.get("optimizer"), dict):  # DeepSpeed's {type, params}; shardsim's is a name
        values.pop("optimizer", None)
        _optimizer(values, data["optimizer"], where)
    comm = _given(data, "communication_data_type", where)
    if comm is not None:
        if comm not in COMM_DTYPES:
            raise ConfigError(
                f"expected fp32, fp16 or bf16, got {comm!r}", where=where, field="communication_data_type"
            )
        _put(values, "reduce_dtype", COMM_DTYPES[comm], "communication_data_type", where)
    for key in data:
        if key in NOTES:
            not_modelled(where, key, NOTES[key])
        elif key in REFUSED:
            not_modelled(where, key, f"{REFUSED[key]}, off")


def check_deepspeed(cfg: RunConfig, dp: int, tp: int, cp: int, pp: int, ep: int) -> None:
    """Library deepspeed's run checked against its `dp` data-parallel ranks: ZeRO over
    data-parallel ranks only (the plans have no tensor, context, pipeline or expert parallelism
    beside it), and DeepSpeed's batch check."""
    for name, degree in (("tp", tp), ("cp", cp), ("pp", pp), ("ep", ep)):
        if degree > 1:
            why = f"library deepspeed is planned over data-parallel ranks only: set {name} 1, got {degree}"
            raise ConfigError(why, where=cfg.source, field=name)
    total = cfg.deepspeed.train_batch_size if cfg.deepspeed else None
    if total is not None:
        check_train_batch(total, cfg.batch_per_device, cfg.grad_accum, dp, cfg.source)


def check_train_batch(total: int, micro: int, steps: int, dp: int, where: str) -> None:
    """DeepSpeed's batch check (`DeepSpeedConfig._batch_assertion`): train_batch_size is
    train_micro_batch_size_per_gpu × gradient_accumulation_steps × the data-parallel ranks."""
    if total != micro * steps * dp:
        raise ConfigError(
            f"train_batch_size {total} is not train_micro_batch_size_per_gpu {micro} x "
            f"gradient_accumulation_steps {steps} x {dp} data-parallel ranks ({micro * steps * dp})",
            where=where,
            field="train_batch_size",
        )
