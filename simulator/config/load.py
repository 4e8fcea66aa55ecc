"""Reading a configuration: a YAML file (SageMaker keys accepted), then flag overrides, checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shardsim.simulator.config.schema import (
    BACKENDS,
    FIELDS,
    OPTIMIZERS,
    PRECISIONS,
    SCHEDULES,
    STRATEGIES,
    RunConfig,
    Strategy,
)
from shardsim.simulator.config.smp import SMP_KEYS, apply_smp, smp_parameters
from shardsim.simulator.errors import ConfigError
from shardsim.simulator.workload.arch import SHAPE_FIELDS, Arch, Shape
from shardsim.simulator.workload.describe import arch_from_mapping
from shardsim.simulator.yamlio import Fields, load_yaml


def _read_file(path: Path) -> tuple[dict[str, Any], str]:
    where = str(path)
    data = load_yaml(path)
    smp, extra = smp_parameters(data, where)
    known = set(FIELDS) | set(SMP_KEYS) | {"distribution", "instance_type", "instance_count", "name", "description"}
    unknown = sorted(k for k in data if k not in known)
    if unknown:
        raise ConfigError(
            f"unknown key; expected one of {', '.join(FIELDS)} or SageMaker keys", where=where, field=unknown[0]
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
    for k in FIELDS:
        if k != "strategy" and k in data and data[k] is not None:
            values[k] = data[k]
    apply_smp(values, smp, extra, where)
    return values, where


def _workload(value: Any, where: str) -> str | Arch:
    """A name or path as given; a mapping (or a flag's ``{family: ..., ...}`` text) as an `Arch`."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(
                f"expected an inline mapping {{family: ..., hidden: ...}}, got {value!r}", where=where, field="workload"
            ) from None
    if isinstance(value, dict):
        return arch_from_mapping(value, where, "workload.")
    if isinstance(value, Arch):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"expected a name, a path or a mapping, got {value!r}", where=where, field="workload")
    return value


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
        workload=_workload(values.get("workload", base.workload), where),
        shape=Shape(**{k: f.integer(k) for k in SHAPE_FIELDS if f.has(k)}),
        topology=f.text("topology", default=base.topology),
        nodes=nodes,
        strategy=strategy,
        batch_per_device=f.integer("batch_per_device", default=base.batch_per_device),
        grad_accum=f.integer("grad_accum", default=base.grad_accum),
        precision=f.text("precision", default=base.precision, choices=PRECISIONS),
        checkpointing=f.boolean("checkpointing", default=base.checkpointing),
        backend=f.text("backend", default=base.backend, choices=BACKENDS),
        optimizer=f.text("optimizer", default=base.optimizer, choices=OPTIMIZERS),
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
