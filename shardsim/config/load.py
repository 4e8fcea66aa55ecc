"""Reading a configuration: a YAML file (SageMaker keys and DeepSpeed's zero_optimization block accepted), then
flag overrides, checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsim.config.deepspeed import DEEPSPEED_KEYS, apply_deepspeed
from shardsim.config.model_defaults import with_model_defaults
from shardsim.config.schema import FIELDS, FOREIGN_ONLY, STRATEGY_FIELDS, RunConfig, strategy_fields
from shardsim.config.smp import (
    FSDP_KEYS,
    SAGEMAKER_CLUSTER_KEYS,
    SMP_KEYS,
    apply_fsdp_keys,
    apply_smp,
    smp_parameters,
)
from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import Fields, check_keys, load_json, load_yaml, parse_yaml, unknown_key
from shardsim.specs.model.arch import SHAPE_FIELDS, Arch
from shardsim.specs.model.describe import arch_from_mapping
from shardsim.specs.strategies import ALIASES, DEFAULT_KIND, STRATEGIES, kind_name

# Keys a configuration file may hold besides the schema's, SageMaker's, FSDP's and DeepSpeed's (name and
# description: ignored)
OTHER_KEYS = (*SAGEMAKER_CLUSTER_KEYS, "name", "description")
FILE_KEYS = (*FIELDS, *SMP_KEYS, *FSDP_KEYS, *DEEPSPEED_KEYS, *OTHER_KEYS)


def _read_file(path: Path) -> tuple[dict[str, Any], str]:
    where = str(path)
    data = load_yaml(path)
    check_keys(data, FILE_KEYS, where=where, expected=f"expected one of {', '.join(FIELDS)} or SageMaker keys")
    smp, extra = smp_parameters(data, where)
    values: dict[str, Any] = {}
    strat = data.get("strategy")
    if isinstance(strat, dict):  # strategy: {kind: zero2d, degree: 4}
        check_keys(strat, ("kind", *STRATEGY_FIELDS), where=where, prefix="strategy.")
        for k, v in strat.items():
            values["strategy" if k == "kind" else k] = v
    elif strat is not None:
        values["strategy"] = strat
    for k in FIELDS:
        if k != "strategy" and k in data and data[k] is not None:
            values[k] = data[k]
    apply_smp(values, smp, extra, where)
    apply_deepspeed(values, data, where)
    apply_fsdp_keys(values, data, where)
    return values, where


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
    (`schema.strategy_fields`), the shape fields into `shape`. `RunConfig` applies it to what
    it is given, so that Python takes what a file takes."""
    values = {k: v for k, v in data.items() if k not in FOREIGN_ONLY}
    smp, extra = smp_parameters(data, where or "")
    apply_smp(values, smp, extra, where or "")
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


def build_config(values: dict[str, Any], where: str) -> RunConfig:
    """The RunConfig of flat settings (a file's keys, flags): a key that is not one of `FIELDS`
    is refused; the model checks every value (`tree_of` puts them in its tree), as it checks one
    built in Python (cluster-independent checks only)."""
    f = Fields(values, where).closed(FIELDS)
    given = {k: f.raw(k) for k in FIELDS if f.has(k)}
    f.text("strategy", default=DEFAULT_KIND, choices=(*STRATEGIES, *ALIASES))
    # Without a node count: the seed's 8 nodes on the default topology; otherwise the
    # topology decides (an emulated cluster has its own count, an instance type gives 1).
    if "nodes" not in given and "topology" in values:
        given["nodes"] = None
    try:
        return with_model_defaults(RunConfig(**given, source=where), given)
    except ConfigError as err:
        raise ConfigError(err.message, where=where, field=err.field) from None


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a config file (optional), apply flag overrides (keys of `FIELDS`; None values ignored), check it."""
    values: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        values, where = _read_file(Path(path))
    for k, v in (overrides or {}).items():
        if k not in FIELDS:
            raise unknown_key(k, FIELDS, where="overrides", field=k)
        if v is not None:
            values[k] = v
    values.pop("_processes_per_host", None)
    if overrides and any(v is not None for v in overrides.values()):
        where = f"{where} + flags" if path is not None else "flags"
    return build_config(values, where)


def load_config_json(path: str | Path) -> RunConfig:
    """A configuration written as JSON (`RunConfig.to_json`: what ranks read from the run folder)."""
    return RunConfig.from_dict(load_json(Path(path)), where=str(path))
