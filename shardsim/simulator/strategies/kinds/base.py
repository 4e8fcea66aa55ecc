"""The protocol every strategy kind implements: what the simulator, the sweep and the runtime ask
of a kind, so that none of them compares kind names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable

    from shardsim.config import Resolved, RunConfig, Strategy
    from shardsim.simulator.compute import ComputeModel
    from shardsim.simulator.plan import Plan, RankClass
    from shardsim.simulator.sweep.space import SweepSpace
    from shardsim.spec.model.workload import Block, Workload


class StrategyKind(Protocol):
    """One way of distributing the model (ddp, zero, zero2d, pipeline).

    Capabilities: `is_pipeline` (stages of consecutive blocks, microbatches and a schedule;
    the other kinds are data parallel), `fsdp` (every parameter sharded with FSDP2 over its
    shard group; takes reshard_after_forward False, ZeRO-2), `replicates` (DDP wraps the model
    even over one rank)."""

    name: str
    description: str
    is_pipeline: bool
    fsdp: bool
    replicates: bool
    color: str  # of its bars and lines in the sweep's plots
    plot_order: int  # its place among the data-parallel kinds in the scaling plot
    fsdp_sharding: dict[str, bool]  # FSDP1's ShardingStrategy names of the kind → reshard_after_forward
    in_default_sweep: bool  # a sweep tries it unless --strategies names the kinds

    def optimizer_params(self, res: Resolved, local_params: float, blocks: list[Block]) -> float:
        """Parameters the optimizer of the busiest rank holding `local_params` of `blocks` steps and
        keeps state for: its own (sharded or not), or zero1's partition of them."""
        ...

    def check(self, s: Strategy, where: str) -> None:
        """Refuse (ConfigError) fields that contradict the kind, before the cluster is known."""
        ...

    def shard(self, s: Strategy, world: int, where: str, node_ranks: int | None = None) -> int:
        """Ranks a parameter is sharded over on a cluster of `world` ranks (resolve), `node_ranks`
        of them on one node (None: not known)."""
        ...

    def resolved(self, shard: int, world: int) -> str:
        """The kind this one is once its shard degree is settled (zero2d over the world is zero)."""
        ...

    def label(self, s: Strategy) -> str:
        """The strategy's label, as tables and records name a configuration."""
        ...

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        """Its short label in the sweep's plots."""
        ...

    def sharded_degree(self, s: Strategy, world: int) -> int:
        """Ranks a parameter is sharded over, as SageMaker's `sharded_data_parallel_degree` counts it."""
        ...

    def sharded(self, res: Resolved) -> bool:
        """Whether a resolved run shards its parameters with FSDP2."""
        ...

    def overlaps(self, res: Resolved) -> bool:
        """Whether its communication overlaps compute over gloo on CPU (NCCL always does)."""
        ...

    def unsharded_bytes(self, cfg: RunConfig, res: Resolved, rc: RankClass, param_bytes: int, grad_bytes: int) -> float:
        """Bytes of parameters (and gradients) a rank of class `rc` holds unsharded at its peak,
        beyond its fp32 master copy (`memory.rank_memory`)."""
        ...

    def activations_in_flight(self, cfg: RunConfig, res: Resolved, stage: int) -> int:
        """Microbatches whose activations a rank of pipeline stage `stage` holds at its peak."""
        ...

    def ops_estimate(self, s: Strategy, grad_accum: int, n_layers: int) -> int:
        """About how many ops the plan of one step holds (resolved strategy; `scale.plan_ops_estimate`)."""
        ...

    def plan(self, p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
        """Add the ops of one training step to `p`."""
        ...

    def sweep(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> Iterable[Strategy]:
        """The strategies of this kind a sweep of `space` tries on `world` ranks."""
        ...

    def sweep_count(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> int:
        """How many strategies `sweep` yields, counted without making them."""
        ...

    def matrix_entries(self, world: int) -> list[dict]:
        """The strategy fields a validation matrix's shorthand of this kind stands for."""
        ...
