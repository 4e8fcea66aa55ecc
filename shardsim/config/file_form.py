"""A configuration's file form into its tree: SageMaker's, FSDP's and DeepSpeed's keys translated,
the strategy's and the shape's fields given flat put in their nodes (`tree_of`), a workload given
inline read as an `Arch` (`workload_value`). `RunConfig` applies both to what it is given, so
that Python takes what a file takes."""

from __future__ import annotations

from typing import Any

from shardsim.config.deepspeed import DEEPSPEED_KEYS, apply_deepspeed
from shardsim.config.ds_config import DS_CONFIG_KEYS, apply_ds_config, precision_blocks
from shardsim.config.smp import FSDP_KEYS, SAGEMAKER_CLUSTER_KEYS, SMP_KEYS, apply_fsdp_keys, apply_smp, smp_parameters
from shardsim.config.strategy import STRATEGY_FIELDS, strategy_fields
from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import parse_yaml
from shardsim.specs.model.arch import SHAPE_FIELDS, Arch
from shardsim.specs.model.describe import arch_from_mapping
from shardsim.specs.strategies import DEFAULT_KIND, STRATEGIES, kind_name

# SageMaker's, FSDP's and DeepSpeed's keys that are no setting's name (`smp`), and beside them the keys of a
# file's flat form: what `RunConfig` takes besides its fields and puts in its tree (`tree_of`)
FOREIGN_ONLY = tuple(
    k
    for k in (*SMP_KEYS, *FSDP_KEYS, *SAGEMAKER_CLUSTER_KEYS, *DEEPSPEED_KEYS, *DS_CONFIG_KEYS)
    if k not in STRATEGY_FIELDS
)
FILE_FORM_KEYS = (*FOREIGN_ONLY, *STRATEGY_FIELDS, *SHAPE_FIELDS)


def workload_value(value: Any, where: str | None) -> str | Arch:
    """A name or path as given; a mapping (or a flag's ``{family: ..., ...}`` text) as an `Arch`."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = parse_yaml(value, where or "workload")
        except ConfigError as err:
            why = f"expected an inline mapping {{family: ..., hidden: ...}}: {err.message}"
            raise ConfigError(why, where=where, field="workload") from None
    if isinstance(value, dict):
        return arch_from_mapping(value, where, "workload.")
    if isinstance(value, Arch):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"expected a name, a path or a mapping, got {value!r}", where=where, field="workload")
    return value


def tree_of(data: dict[str, Any], where: str | None) -> dict[str, Any]:
    """A mapping in a file's form as the tree's fields: SageMaker's and FSDP's keys translated
    (`smp`, contradictions refused), the strategy's fields (flat) into its kind's model
    (`strategy.strategy_fields`), the shape fields into `shape`. `RunConfig` applies it to what
    it is given, so that Python takes what a file takes."""
    data = precision_blocks(data, where or "")
    values = {k: v for k, v in data.items() if k not in FOREIGN_ONLY}
    smp, extra = smp_parameters(data, where or "")
    apply_smp(values, smp, extra, where or "")
    apply_ds_config(values, data, where or "")
    apply_deepspeed(values, data, where or "")
    apply_fsdp_keys(values, data, where or "")
    values.pop("_processes_per_host", None)
    flat = {k: values.pop(k) for k in STRATEGY_FIELDS if k in values}
    flat = {k: v for k, v in flat.items() if v is not None}
    strategy = values.get("strategy")
    if strategy is None or isinstance(strategy, str):
        kind = DEFAULT_KIND if strategy is None else kind_name(strategy)
        if kind not in STRATEGIES:
            why = f"expected one of {', '.join(STRATEGIES)}, got {kind!r}"
            raise ConfigError(why, where=where, field="strategy")
        if flat or strategy is not None:
            values["strategy"] = strategy_fields(kind, flat, where)
    elif flat:
        raise ConfigError("given beside a whole strategy; give it in the strategy", where=where, field=next(iter(flat)))
    shape = {k: values.pop(k) for k in SHAPE_FIELDS if k in values and values[k] is not None}
    if shape:
        if values.get("shape") is not None:
            raise ConfigError("given beside a whole shape; give it in the shape", where=where, field=next(iter(shape)))
        values["shape"] = shape
    return values
