"""zero1: ZeRO stage 1 as PyTorch runs it, `DistributedDataParallel` with
`torch.distributed.optim.ZeroRedundancyOptimizer`: parameters and gradients replicated (DDP's
bucket all-reduces), Adam's state partitioned over the data-parallel ranks, each rank stepping
its partition and broadcasting it to the others."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardsim.core.errors import ConfigError
from shardsim.simulator.strategies.kinds.ddp import Ddp

if TYPE_CHECKING:
    from shardsim.config import Resolved, RunConfig, Strategy
    from shardsim.simulator.compute import ComputeModel
    from shardsim.simulator.plan import Plan
    from shardsim.spec.model.workload import Block, Workload


class Zero1(Ddp):
    name = "zero1"
    description = "DDP with ZeroRedundancyOptimizer: optimizer state sharded, parameters and gradients replicated"
    color = "#8172B3"
    plot_order = 0
    in_default_sweep = False  # asked for by name (--strategies zero1): the committed sweeps predate it
    fsdp_sharding: dict[str, bool] = {}

    def check(self, s: Strategy, where: str) -> None:
        if s.degree not in (None, 1):
            why = f"zero1 shards Adam's state over all data-parallel ranks; a shard degree of {s.degree} contradicts it"
            raise ConfigError(why, where=where, field="degree")

    def label(self, s: Strategy) -> str:
        return self.name

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        return "zero1"

    def optimizer_params(self, res: Resolved, local_params: float, blocks: list[Block]) -> float:
        from shardsim.simulator.strategies.zero1 import largest_partition

        return largest_partition(local_params, blocks, res.replicas)  # over the DDP process group

    def ops_estimate(self, s: Strategy, grad_accum: int, n_layers: int) -> int:
        # DDP's, plus one broadcast per data-parallel rank (unknown here: not counted)
        return super().ops_estimate(s, grad_accum, n_layers) + 1

    def plan(self, p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
        from shardsim.simulator.strategies.zero1 import zero1_plan

        zero1_plan(p, cm, cfg, res, w)

    def matrix_entries(self, world: int) -> list[dict]:
        return [{"strategy": self.name}]


ZERO1 = Zero1()
