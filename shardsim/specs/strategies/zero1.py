"""zero1: ZeRO stage 1 as PyTorch runs it, `DistributedDataParallel` with
`torch.distributed.optim.ZeroRedundancyOptimizer`: parameters and gradients replicated (DDP's
bucket all-reduces), Adam's state partitioned over the data-parallel ranks, each rank stepping
its partition and broadcasting it to the others."""

from __future__ import annotations

from shardsim.core.errors import ConfigError
from shardsim.specs.strategies.base import StrategyFields
from shardsim.specs.strategies.ddp import Ddp


class Zero1(Ddp):
    name = "zero1"
    description = "DDP with ZeroRedundancyOptimizer: optimizer state sharded, parameters and gradients replicated"
    fsdp_sharding: dict[str, bool] = {}

    def check(self, s: StrategyFields, where: str) -> None:
        if s.degree not in (None, 1):
            why = f"zero1 shards Adam's state over all data-parallel ranks; a shard degree of {s.degree} contradicts it"
            raise ConfigError(why, where=where, field="degree")

    def label(self, s: StrategyFields) -> str:
        return self.name


ZERO1 = Zero1()
