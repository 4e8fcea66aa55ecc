"""pipeline: `pp` stages of consecutive blocks (`torch.distributed.pipelining`), `microbatches`
under a `schedule`; each stage plain, DDP over its replicas, or FSDP2 over groups of `degree`."""

from __future__ import annotations

from shardsim.core.errors import ConfigError
from shardsim.specs.schedules import ALL, schedule_refusal
from shardsim.specs.strategies.base import StrategyFields


class Pipeline:
    name = "pipeline"
    description = "pp stages of consecutive blocks, microbatches under a schedule; stages plain, DDP or FSDP2"
    is_pipeline = True
    fsdp = False
    replicates = False
    fsdp_sharding: dict[str, bool] = {}

    def check(self, s: StrategyFields, where: str) -> None:
        """Refuse the schedule with these sizes where PyTorch's schedule class does (`schedule_refusal`)."""
        v = getattr(s, "stages_per_rank", 1)
        sizes = (s.pp, s.microbatches, v)
        if s.schedule in ALL and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in sizes):
            refused = schedule_refusal(s.schedule, *sizes)
            if refused:
                raise ConfigError(refused[1], where=where, field=refused[0])

    def shard(self, s: StrategyFields, world: int, where: str, node_ranks: int | None = None) -> int:
        return s.degree or 1

    def resolved(self, shard: int, world: int) -> str:
        return self.name

    def label(self, s: StrategyFields) -> str:
        shard = f" d={s.degree}" if s.degree and s.degree > 1 else ""
        v = getattr(s, "stages_per_rank", 1)
        virtual = f" v={v}" if v > 1 else ""
        split = getattr(s, "layers_per_stage", None)
        layers = f" layers={split}" if split else ""
        return f"pipeline pp={s.pp} m={s.microbatches} {s.schedule}{virtual}{shard}{layers}"

    def sharded_degree(self, s: StrategyFields, world: int) -> int:
        return s.degree or 1


PIPELINE = Pipeline()
