"""The protocol every strategy kind's spec implements: what the configuration asks of a kind
(its checks, shard degree, label and capabilities), so that it compares no kind names. The
planner (`simulator.strategies.planners`), the sweep's face (`sweep.faces`), the runtime's
engine (`runtime.strategies`) and the validation matrix's shorthand (`runtime.validation.shorthand`)
are registries of their own under the same names."""

from __future__ import annotations

from typing import Protocol


class StrategyFields(Protocol):
    """The fields of a configured strategy a spec reads (`config.Strategy` has them, and so has
    the configuration's flat form before its kind's model is built)."""

    kind: str
    degree: int | None
    pp: int
    microbatches: int
    schedule: str
    reshard_after_forward: bool


class StrategySpec(Protocol):
    """One way of distributing the model (ddp, zero, zero2d, pipeline, zero1), as configured.

    Capabilities: `is_pipeline` (stages of consecutive blocks, microbatches and a schedule;
    the other kinds are data parallel), `fsdp` (every parameter sharded with FSDP2 over its
    shard group; takes reshard_after_forward False, ZeRO-2), `replicates` (DDP wraps the model
    even over one rank)."""

    name: str
    description: str
    is_pipeline: bool
    fsdp: bool
    replicates: bool
    fsdp_sharding: dict[str, bool]  # FSDP1's ShardingStrategy names of the kind → reshard_after_forward

    def check(self, s: StrategyFields, where: str) -> None:
        """Refuse (ConfigError) fields that contradict the kind, before the cluster is known."""
        ...

    def shard(self, s: StrategyFields, world: int, where: str, node_ranks: int | None = None) -> int:
        """Ranks a parameter is sharded over on a cluster of `world` ranks (resolve), `node_ranks`
        of them on one node (None: not known)."""
        ...

    def resolved(self, shard: int, world: int) -> str:
        """The kind this one is once its shard degree is settled (zero2d over the world is zero)."""
        ...

    def label(self, s: StrategyFields) -> str:
        """The strategy's label, as tables and records name a configuration."""
        ...

    def sharded_degree(self, s: StrategyFields, world: int) -> int:
        """Ranks a parameter is sharded over, as SageMaker's `sharded_data_parallel_degree` counts it."""
        ...
