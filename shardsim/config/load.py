"""Reading a configuration: a YAML file (SageMaker keys and a DeepSpeed config accepted), then
flag overrides, checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsim.config.deepspeed import DEEPSPEED_KEYS, apply_deepspeed
from shardsim.config.ds_config import DS_CONFIG_KEYS, apply_ds_config, precision_blocks
from shardsim.config.model_defaults import with_model_defaults
from shardsim.config.schema import FIELDS, RunConfig
from shardsim.config.smp import (
    FSDP_KEYS,
    SAGEMAKER_CLUSTER_KEYS,
    SMP_KEYS,
    apply_fsdp_keys,
    apply_smp,
    smp_parameters,
)
from shardsim.config.strategy import STRATEGY_FIELDS
from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import Fields, check_keys, load_json, load_yaml, unknown_key
from shardsim.specs.strategies import ALIASES, DEFAULT_KIND, STRATEGIES

# Keys a configuration file may hold besides the schema's, SageMaker's, FSDP's and DeepSpeed's (name and
# description: ignored)
OTHER_KEYS = (*SAGEMAKER_CLUSTER_KEYS, "name", "description")
FILE_KEYS = (*FIELDS, *SMP_KEYS, *FSDP_KEYS, *DEEPSPEED_KEYS, *DS_CONFIG_KEYS, *OTHER_KEYS)


def _read_file(path: Path) -> tuple[dict[str, Any], str]:
    where = str(path)
    data = load_yaml(path)
    check_keys(data, FILE_KEYS, where=where, expected=f"expected one of {', '.join(FIELDS)} or SageMaker keys")
    data = precision_blocks(data, where)
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
    apply_ds_config(values, data, where)
    apply_deepspeed(values, data, where)
    apply_fsdp_keys(values, data, where)
    return values, where


def build_config(values: dict[str, Any], where: str) -> RunConfig:
    """The RunConfig of flat settings (a file's keys, flags): a key that is not one of `FIELDS`
    is refused; the model checks every value (`file_form.tree_of` puts them in its tree), as it checks one
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
