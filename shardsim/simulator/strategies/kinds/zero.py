"""zero: FSDP2 `fully_shard` over the whole world (ZeRO-3; ZeRO-2 with reshard_after_forward False)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardsim.core.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from shardsim.config import Resolved, RunConfig, Strategy
    from shardsim.simulator.compute import ComputeModel
    from shardsim.simulator.plan import Plan, RankClass
    from shardsim.simulator.sweep.space import SweepSpace
    from shardsim.spec.model.workload import Block, Workload


class Fsdp:
    """What the FSDP2 kinds share (zero, zero2d): every parameter sharded, one plan."""

    name = ""
    description = ""
    is_pipeline = False
    fsdp = True
    replicates = False
    color = ""
    plot_order = 0
    fsdp_sharding: dict[str, bool] = {}
    in_default_sweep = True

    def check(self, s: Strategy, where: str) -> None:
        return None

    def label(self, s: Strategy) -> str:
        return self.name + ("" if s.reshard_after_forward else " (ZeRO-2)")

    def sharded(self, res: Resolved) -> bool:
        return True

    def overlaps(self, res: Resolved) -> bool:
        return False  # FSDP2 on CPU has no streams: serialized

    def unsharded_bytes(self, cfg: RunConfig, res: Resolved, rc: RankClass, param_bytes: int, grad_bytes: int) -> float:
        from shardsim.simulator.memory import autocast_copies, fsdp_gathered

        if res.shard > 1:
            return fsdp_gathered(cfg, rc, param_bytes, grad_bytes)
        return autocast_copies(rc, param_bytes)  # over one rank nothing is sharded

    def optimizer_params(self, res: Resolved, local_params: float, blocks: list[Block]) -> float:
        return local_params

    def activations_in_flight(self, cfg: RunConfig, res: Resolved, stage: int) -> int:
        return 1

    def ops_estimate(self, s: Strategy, grad_accum: int, n_layers: int) -> int:
        # a unit a micro-step: all-gather, copy-out, forward, again in backward, reduce-scatter, all-reduce
        return 8 * grad_accum * (n_layers + 2) + 4

    def plan(self, p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
        from shardsim.simulator.strategies.fsdp import zero_plan

        zero_plan(p, cm, cfg, res, w)


class Zero(Fsdp):
    name = "zero"
    description = "FSDP2 over the whole world (ZeRO-3; ZeRO-2 with reshard_after_forward false)"
    color = "#C44E52"
    plot_order = 2
    fsdp_sharding = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}

    def shard(self, s: Strategy, world: int, where: str, node_ranks: int | None = None) -> int:
        if s.degree not in (None, world):
            raise ConfigError(
                f"zero shards over the whole world ({world}); degree {s.degree} contradicts it (use zero2d)",
                where=where,
                field="degree",
            )
        return world

    def resolved(self, shard: int, world: int) -> str:
        return self.name

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        return f"zero (d={degree})"

    def sharded_degree(self, s: Strategy, world: int) -> int:
        return world

    def sweep(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> Iterable[Strategy]:
        from shardsim.config import Strategy

        for raf in reshard:
            yield Strategy(self.name, reshard_after_forward=raf)

    def sweep_count(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> int:
        return len(reshard)

    def matrix_entries(self, world: int) -> list[dict]:
        return [{"strategy": self.name}]


ZERO = Zero()
