"""Reading a configuration: a YAML file (SageMaker keys accepted), then flag overrides, checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsim.config.schema import (
    BACKENDS,
    CHECKPOINTING,
    FIELDS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    SAC_OP,
    SCHEDULES,
    STRATEGIES,
    STRATEGY_FIELDS,
    RunConfig,
    Strategy,
)
from shardsim.config.smp import FSDP_KEYS, SMP_KEYS, apply_fsdp_keys, apply_smp, smp_parameters
from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import Fields, check_keys, load_yaml, parse_yaml, unknown_key
from shardsim.simulator.scale import check_settings
from shardsim.simulator.strategies.kinds import STRATEGIES as KINDS
from shardsim.simulator.workload.arch import SHAPE_FIELDS, Arch, Shape
from shardsim.simulator.workload.describe import arch_from_mapping

# Keys a configuration file may hold besides the schema's, SageMaker's and FSDP's (name and description: ignored)
OTHER_KEYS = ("distribution", "instance_type", "instance_count", "name", "description")
FILE_KEYS = (*FIELDS, *SMP_KEYS, *FSDP_KEYS, *OTHER_KEYS)


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
    apply_fsdp_keys(values, data, where)
    return values, where


def _checkpointing(f: Fields, default: str) -> str:
    """none | full | selective; true/false (the seed's spelling) read as full/none."""
    value = f.raw("checkpointing")
    if isinstance(value, bool):
        return "full" if value else "none"
    return f.text("checkpointing", default=default, choices=CHECKPOINTING)


def _sac_option(values: dict[str, Any], where: str) -> str:
    """selective_ac_option: "op", or k >= 1 (every k-th layer), kept as text as torchtitan does."""
    value = values.get("selective_ac_option")
    if value is None:
        return SAC_OP
    text = str(value).strip() if isinstance(value, int | str) and not isinstance(value, bool) else ""
    if text != SAC_OP and not (text.isdigit() and int(text) >= 1):
        why = f"expected op or an integer k >= 1 (every k-th layer), got {value!r}"
        raise ConfigError(why, where=where, field="selective_ac_option")
    return text


def _workload(value: Any, where: str) -> str | Arch:
    """A name or path as given; a mapping (or a flag's ``{family: ..., ...}`` text) as an `Arch`."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = parse_yaml(value, where)
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


def build_config(values: dict[str, Any], where: str) -> RunConfig:
    """Check field types and ranges and build a RunConfig (cluster-independent checks only); a key
    that is not one of `FIELDS` is refused."""
    f = Fields(values, where).closed(FIELDS)
    base = RunConfig()
    kind = f.text("strategy", default=base.strategy.kind, choices=STRATEGIES)
    degree = f.integer("degree", default=0, minimum=1) if f.has("degree") else None
    strategy = Strategy(
        kind=kind,
        degree=degree,
        pp=f.integer("pp", default=1),
        microbatches=f.integer("microbatches", default=1),
        schedule=f.text("schedule", default="1f1b", choices=SCHEDULES),
        reshard_after_forward=f.boolean("reshard_after_forward", default=True),
    )
    spec = strategy.spec
    if not spec.is_pipeline and strategy.pp > 1:
        raise ConfigError(f"pp={strategy.pp} needs strategy pipeline, got {kind}", where=where, field="pp")
    spec.check(strategy, where)
    if not strategy.reshard_after_forward and not spec.fsdp:
        fsdp = " and ".join(k for k, v in KINDS.items() if v.fsdp)
        raise ConfigError(
            f"reshard_after_forward false (ZeRO-2) applies to {fsdp}, not {kind}",
            where=where,
            field="reshard_after_forward",
        )
    # Without a node count: the seed's 8 nodes on the default topology; otherwise the
    # topology decides (an emulated cluster has its own count, an instance type gives 1).
    if "nodes" in values:
        nodes: int | None = f.integer("nodes")
    else:
        nodes = base.nodes if "topology" not in values else None
    paths = {k: values.get(k) for k in ("profile", "calibration")}
    for k, v in paths.items():
        if v is not None and not isinstance(v, str):
            raise ConfigError(f"expected a file path, got {v!r}", where=where, field=k)
    cfg = RunConfig(
        workload=_workload(values.get("workload", base.workload), where),
        shape=Shape(**{k: f.integer(k) for k in SHAPE_FIELDS if f.has(k)}),
        topology=f.text("topology", default=base.topology),
        nodes=nodes,
        strategy=strategy,
        batch_per_device=f.integer("batch_per_device", default=base.batch_per_device),
        grad_accum=f.integer("grad_accum", default=base.grad_accum),
        precision=f.text("precision", default=base.precision, choices=PRECISIONS),
        checkpointing=_checkpointing(f, base.checkpointing),
        selective_ac_option=_sac_option(values, where),
        reduce_dtype=f.text("reduce_dtype", choices=PRECISIONS) if f.has("reduce_dtype") else None,
        backend=f.text("backend", default=base.backend, choices=BACKENDS),
        optimizer=f.text("optimizer", default=base.optimizer, choices=OPTIMIZERS),
        optimizer_impl=f.text("optimizer_impl", default=base.optimizer_impl, choices=OPTIMIZER_IMPLS),
        profile=paths["profile"],
        calibration=paths["calibration"],
        seed=f.integer("seed", default=0, minimum=0),
        source=where,
    )
    check_settings(cfg)
    return cfg


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
