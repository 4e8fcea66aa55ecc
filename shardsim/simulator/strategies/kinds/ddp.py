"""ddp: `DistributedDataParallel`, the model replicated on every rank."""

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


class Ddp:
    name = "ddp"
    description = "DistributedDataParallel: the model replicated, gradients all-reduced"
    is_pipeline = False
    fsdp = False
    replicates = True
    color = "#4C72B0"
    plot_order = 0
    in_default_sweep = True
    fsdp_sharding = {"NO_SHARD": True}

    def check(self, s: Strategy, where: str) -> None:
        if s.degree not in (None, 1):
            raise ConfigError(
                f"ddp replicates the model; a shard degree of {s.degree} contradicts it", where=where, field="degree"
            )

    def shard(self, s: Strategy, world: int, where: str, node_ranks: int | None = None) -> int:
        return 1

    def resolved(self, shard: int, world: int) -> str:
        return self.name

    def label(self, s: Strategy) -> str:
        return self.name + ("" if s.reshard_after_forward else " (ZeRO-2)")

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        return "ddp (d=1)"

    def sharded_degree(self, s: Strategy, world: int) -> int:
        return 1

    def sharded(self, res: Resolved) -> bool:
        return False

    def overlaps(self, res: Resolved) -> bool:
        return True  # DDP's reducer runs gloo asynchronously

    def unsharded_bytes(self, cfg: RunConfig, res: Resolved, rc: RankClass, param_bytes: int, grad_bytes: int) -> float:
        from shardsim.simulator.memory import autocast_copies

        return autocast_copies(rc, param_bytes)

    def optimizer_params(self, res: Resolved, local_params: float, blocks: list[Block]) -> float:
        return local_params

    def activations_in_flight(self, cfg: RunConfig, res: Resolved, stage: int) -> int:
        return 1

    def ops_estimate(self, s: Strategy, grad_accum: int, n_layers: int) -> int:
        # one all-reduce a block: a model whose blocks hold over 25 MiB of gradients each has
        # more buckets than blocks (and a compression hook 3 ops a bucket), not counted here
        return 2 * (grad_accum + 1) * (n_layers + 2)

    def plan(self, p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
        from shardsim.simulator.strategies.ddp import ddp_plan

        ddp_plan(p, cm, cfg, res, w)

    def sweep(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> Iterable[Strategy]:
        from shardsim.config import Strategy

        yield Strategy(self.name)

    def sweep_count(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> int:
        return 1

    def matrix_entries(self, world: int) -> list[dict]:
        return [{"strategy": self.name}]


DDP = Ddp()
