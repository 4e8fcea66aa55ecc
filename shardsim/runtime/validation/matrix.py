"""A validation matrix: a workload and its settings, and per emulated topology the
configurations to check (shorthands expanded, each resolved against its cluster)."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardsim.config import STRATEGIES, RunConfig, build_config, resolve
from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import check_keys, load_yaml
from shardsim.data import MATRICES
from shardsim.runtime.emulation.hostspeed import QUIET_STEAL_SHARE
from shardsim.runtime.validation.shorthand import SHORTHANDS
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.strategies import kind_name

DEFAULT_MATRIX = MATRICES / "default.yaml"
_BASE_KEYS = ("workload", "batch_per_device", "grad_accum", "precision", "checkpointing", "backend", "seed")
_RUN_KEYS = ("steps", "warmup", "timeout", "max_steal", "retries")
_STRATEGY_KEYS = (
    "strategy",
    "degree",
    "pp",
    "microbatches",
    "schedule",
    "stages_per_rank",
    "layers_per_stage",
    "tp",
    "sequence_parallel",
    "mesh_order",
    "tp_across_nodes",
    "ep",
)


@dataclass(frozen=True)
class Matrix:
    """A matrix file, checked: the shared settings, each topology's configurations, how to run them."""

    path: str
    base: dict[str, Any]  # config fields shared by every row (workload, batch, precision, ...)
    topologies: tuple[tuple[str, tuple[RunConfig, ...]], ...]  # per topology, its checked configurations
    steps: int = 4
    warmup: int = 1
    timeout: float = 60.0
    max_steal: float = QUIET_STEAL_SHARE  # a step where the hypervisor took more of the cores' time is set aside
    retries: int = 2  # more attempts at a configuration with fewer than half its steps quiet

    @property
    def quiet_steps_needed(self) -> int:
        return max(1, math.ceil(self.steps / 2))

    @property
    def configs(self) -> list[RunConfig]:
        return [c for _, cs in self.topologies for c in cs]

    def microbatch_sizes(self) -> list[int]:
        """Every microbatch size a row runs (the profile times each)."""
        out = set()
        for cfg in self.configs:
            cluster = make_cluster(cfg.topology, cfg.nodes)
            out.add(_resolve(cfg, cluster.world, cluster.devices_per_node)[1].microbatch_size)
        return sorted(out)

    def tp_layouts(self) -> list[tuple[int, bool]]:
        """Every (tp, sequence_parallel) with tp > 1 a row runs (the profile times each rank's share)."""
        return sorted({(c.strategy.tp, c.strategy.sequence_parallel) for c in self.configs if c.strategy.tp > 1})


def _resolve(cfg: RunConfig, world: int, devices_per_node: int | None = None):
    """`resolve` against the model (its arch: tensor parallelism is checked against it) and, where
    given, the cluster's devices per node."""
    from shardsim.runtime.models.build import n_blocks
    from shardsim.specs.model.load import resolve_arch

    arch = resolve_arch(cfg.workload, cfg.shape)[1]
    blocks = n_blocks(cfg.workload, cfg.shape, pipeline=cfg.strategy.spec.is_pipeline)
    tied = bool(arch and arch.tied_embeddings)
    return resolve(cfg, world, blocks, tied_embeddings=tied, arch=arch, devices_per_node=devices_per_node)


def _expand(entry: Any, world: int, where: str, key: str) -> list[dict[str, Any]]:
    """One matrix entry → strategy fields. Shorthands: ddp, zero, zero2d (every degree strictly
    between 1 and the world), pipeline (pp 2, microbatches 2·pp, gpipe and 1f1b)."""
    if isinstance(entry, str):
        entry = kind_name(entry)
        if entry not in STRATEGIES:
            near = difflib.get_close_matches(entry, STRATEGIES, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"expected one of {', '.join(STRATEGIES)}"
            raise ConfigError(f"unknown strategy {entry!r}; {hint}", where=where, field=key)
        return SHORTHANDS[entry](world)
    if isinstance(entry, dict):
        check_keys(
            entry, _STRATEGY_KEYS, where=where, prefix=f"{key}.", expected=f"expected {', '.join(_STRATEGY_KEYS)}"
        )
        return [dict(entry)]
    raise ConfigError(f"expected a strategy name or a mapping, got {entry!r}", where=where, field=key)


def load_matrix(path: str | Path | None = None) -> Matrix:
    """Read and check a matrix file (default: the shipped one). Every configuration is resolved
    against its cluster here, so bad input fails before anything runs."""
    from shardsim.core.documents import checked
    from shardsim.runtime.validation.matrix_schema import MatrixDoc

    p = Path(path) if path is not None else DEFAULT_MATRIX
    where = str(p)
    data = load_yaml(p)
    expected = f"expected {', '.join(_BASE_KEYS + _RUN_KEYS)} or topologies"
    check_keys(data, (*_BASE_KEYS, *_RUN_KEYS, "topologies", "description"), where=where, expected=expected)
    doc = checked(MatrixDoc, data, where)
    base = {k: data[k] for k in _BASE_KEYS if k in data}
    base.setdefault("backend", "gloo")
    tops = data.get("topologies")
    if not isinstance(tops, dict) or not tops:
        raise ConfigError("expected a mapping of emulated topology → configurations", where=where, field="topologies")
    out = []
    for top, entries in tops.items():
        key = f"topologies.{top}"
        try:
            cluster = make_cluster(str(top))
        except ConfigError as exc:
            raise ConfigError(exc.message, where=where, field=key) from None
        if cluster.instance.emulated is None:
            raise ConfigError(
                f"topology {top!r} is not emulated; validate runs on emulated clusters", where=where, field=key
            )
        if not isinstance(entries, list) or not entries:
            raise ConfigError("expected a list of configurations", where=where, field=key)
        cfgs: list[RunConfig] = []
        for i, entry in enumerate(entries):
            for fields in _expand(entry, cluster.world, where, f"{key}[{i}]"):
                at = f"{key}[{i}]"
                try:
                    cfg = build_config(
                        {**base, **fields, "topology": str(top), "nodes": cluster.nodes}, f"{where} {at}"
                    )
                    cfg = _resolve(cfg, cluster.world, cluster.devices_per_node)[0]
                except ConfigError as exc:
                    if exc.where is not None:
                        raise
                    raise ConfigError(exc.message, where=where, field=exc.field or at) from None
                if cfg not in cfgs:
                    cfgs.append(cfg)
        out.append((str(top), tuple(cfgs)))
    run: dict[str, Any] = {k: getattr(doc, k) for k in _RUN_KEYS if data.get(k) is not None}
    return Matrix(where, base, tuple(out), **run)


def steal_bound(v: Any, where: str | None, name: str) -> float:
    """A part of the host's cores' time, 0 < v <= 1 (the quiet-step bound)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
        raise ConfigError(f"expected a part of the cores' time, 0 < {name} <= 1, got {v!r}", where=where, field=name)
    return float(v)
