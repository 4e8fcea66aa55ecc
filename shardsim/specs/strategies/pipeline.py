"""pipeline: `pp` stages of consecutive blocks (`torch.distributed.pipelining`), `microbatches`
under a `schedule`; each stage plain, DDP over its replicas, or FSDP2 over groups of `degree`."""

from __future__ import annotations

from shardsim.specs.strategies.base import StrategyFields


class Pipeline:
    name = "pipeline"
    description = "pp stages of consecutive blocks, microbatches under a schedule; stages plain, DDP or FSDP2"
    is_pipeline = True
    fsdp = False
    replicates = False
    fsdp_sharding: dict[str, bool] = {}

    def check(self, s: StrategyFields, where: str) -> None:
        return None

    def shard(self, s: StrategyFields, world: int, where: str, node_ranks: int | None = None) -> int:
        return s.degree or 1

    def resolved(self, shard: int, world: int) -> str:
        return self.name

    def label(self, s: StrategyFields) -> str:
        shard = f" d={s.degree}" if s.degree and s.degree > 1 else ""
        return f"pipeline pp={s.pp} m={s.microbatches} {s.schedule}{shard}"

    def sharded_degree(self, s: StrategyFields, world: int) -> int:
        return s.degree or 1


PIPELINE = Pipeline()
