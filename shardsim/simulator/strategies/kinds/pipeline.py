"""pipeline: `pp` stages of consecutive blocks (`torch.distributed.pipelining`), `microbatches`
under a `schedule`; each stage plain, DDP over its replicas, or FSDP2 over groups of `degree`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from shardsim.config import Resolved, RunConfig, Strategy
    from shardsim.simulator.compute import ComputeModel
    from shardsim.simulator.plan import Plan, RankClass
    from shardsim.simulator.sweep.space import SweepSpace
    from shardsim.spec.model.workload import Block, Workload


def pipeline_axes(
    world: int, n_layers: int, batch_per_device: int, space: SweepSpace
) -> list[tuple[int, list[int], list[int]]]:
    """(pp, the stages' shard degrees, microbatch counts) of every pipeline degree of the space."""
    from shardsim.simulator.sweep.space import default_microbatches, divisors

    pps = sorted(space.pp) if space.pp is not None else [p for p in divisors(world) if 2 <= p <= n_layers]
    out = []
    for pp in pps:
        if pp < 2:
            continue  # a one-stage pipeline is data parallel: ddp/zero/zero2d cover it
        stage_ranks = world // pp if world % pp == 0 else 0
        if space.degrees is not None:
            ds = sorted(set(space.degrees))
        else:
            ds = divisors(stage_ranks) if stage_ranks else [1]
        if space.microbatches is not None:
            ms = sorted(space.microbatches)
        else:
            ms = default_microbatches(pp, batch_per_device)
        out.append((pp, ds, ms))
    return out


class Pipeline:
    name = "pipeline"
    description = "pp stages of consecutive blocks, microbatches under a schedule; stages plain, DDP or FSDP2"
    is_pipeline = True
    fsdp = False
    replicates = False
    color = "#55A868"
    plot_order = 3
    in_default_sweep = True
    fsdp_sharding: dict[str, bool] = {}

    def check(self, s: Strategy, where: str) -> None:
        return None

    def shard(self, s: Strategy, world: int, where: str, node_ranks: int | None = None) -> int:
        return s.degree or 1

    def resolved(self, shard: int, world: int) -> str:
        return self.name

    def label(self, s: Strategy) -> str:
        shard = f" d={s.degree}" if s.degree and s.degree > 1 else ""
        return f"pipeline pp={s.pp} m={s.microbatches} {s.schedule}{shard}"

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        shard = f" d={degree}" if degree > 1 else ""
        return f"pp={pp} m={microbatches} {schedule}{shard}"

    def sharded_degree(self, s: Strategy, world: int) -> int:
        return s.degree or 1

    def sharded(self, res: Resolved) -> bool:
        return res.shard > 1

    def overlaps(self, res: Resolved) -> bool:
        return res.shard == 1  # replicated stages run DDP, whose reducer runs gloo asynchronously

    def unsharded_bytes(self, cfg: RunConfig, res: Resolved, rc: RankClass, param_bytes: int, grad_bytes: int) -> float:
        from shardsim.simulator.memory import autocast_copies, pipelined_unsharded

        if res.shard > 1:
            return pipelined_unsharded(rc, param_bytes, grad_bytes)
        return autocast_copies(rc, param_bytes)

    def optimizer_params(self, res: Resolved, local_params: float, blocks: list[Block]) -> float:
        return local_params

    def activations_in_flight(self, cfg: RunConfig, res: Resolved, stage: int) -> int:
        """GPipe holds every microbatch's activations; 1F1B at most P - s on stage s."""
        if cfg.strategy.schedule == "gpipe":
            return res.microbatches
        return min(res.pp - stage, res.microbatches)

    def ops_estimate(self, s: Strategy, grad_accum: int, n_layers: int) -> int:
        units = math.ceil(n_layers / s.pp) + 2  # of one stage, with the embedding and the head
        per_microbatch = 4 * units + 6 if (s.degree or 1) > 1 else 6  # a sharded stage runs each block's ops
        return grad_accum * s.pp * (s.microbatches * per_microbatch + 4 * units) + s.pp

    def plan(self, p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
        from shardsim.simulator.strategies.pipeline import pipeline_plan

        pipeline_plan(p, cm, cfg, res, w)

    def sweep(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> Iterable[Strategy]:
        from shardsim.config import Strategy

        for pp, ds, ms in pipeline_axes(world, n_layers, batch_per_device, space):
            for d in ds:
                for m in ms:
                    for sched in space.schedules:
                        yield Strategy(self.name, degree=d, pp=pp, microbatches=m, schedule=sched)

    def sweep_count(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> int:
        axes = pipeline_axes(world, n_layers, batch_per_device, space)
        return sum(len(ds) * len(ms) for _, ds, ms in axes) * len(space.schedules)

    def matrix_entries(self, world: int) -> list[dict]:
        return [{"strategy": self.name, "pp": 2, "microbatches": 4, "schedule": s} for s in ("gpipe", "1f1b")]


PIPELINE = Pipeline()
