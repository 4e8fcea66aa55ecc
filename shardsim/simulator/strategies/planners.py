"""What the simulator asks of each strategy kind: the plan of one training step, what a rank
holds in memory, its op-count estimate and whether its communication overlaps compute. One
planner per kind, in `PLANNERS` under the names of `specs.strategies.STRATEGIES` (a test checks
that every concern's registry holds the same names)."""

from __future__ import annotations

import math
from typing import Protocol

from shardsim.config import Resolved, RunConfig, Strategy
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.plan import Plan, RankClass
from shardsim.simulator.strategies.ddp import ddp_plan
from shardsim.simulator.strategies.fsdp import zero_plan
from shardsim.simulator.strategies.held import autocast_copies, fsdp_gathered, pipelined_unsharded
from shardsim.simulator.strategies.pipeline import pipeline_plan
from shardsim.simulator.strategies.virtual_pipeline import virtual_pipeline_plan
from shardsim.simulator.strategies.zero1 import largest_partition, zero1_plan
from shardsim.specs.model.workload import Block, Workload
from shardsim.specs.schedules import ZERO_BUBBLE
from shardsim.specs.strategies import DDP, PIPELINE, ZERO, ZERO1, ZERO2D


class Planner(Protocol):
    """How the simulator plans and costs one kind."""

    def plan(self, p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
        """Add the ops of one training step to `p`."""
        ...

    def unsharded_bytes(self, cfg: RunConfig, res: Resolved, rc: RankClass, param_bytes: int, grad_bytes: int) -> float:
        """Bytes of parameters (and gradients) a rank of class `rc` holds unsharded at its peak,
        beyond its fp32 master copy (`memory.rank_memory`)."""
        ...

    def activations_in_flight(self, cfg: RunConfig, res: Resolved, stage: int) -> int:
        """Microbatches whose activations a rank of pipeline stage `stage` holds at its peak."""
        ...

    def optimizer_params(self, res: Resolved, local_params: float, blocks: list[Block]) -> float:
        """Parameters the optimizer of the busiest rank holding `local_params` of `blocks` steps and
        keeps state for: its own (sharded or not), or zero1's partition of them."""
        ...

    def ops_estimate(self, s: Strategy, grad_accum: int, n_layers: int) -> int:
        """About how many ops the plan of one step holds (resolved strategy; `scale.plan_ops_estimate`)."""
        ...

    def sharded(self, res: Resolved) -> bool:
        """Whether a resolved run shards its parameters with FSDP2."""
        ...

    def overlaps(self, res: Resolved) -> bool:
        """Whether its communication overlaps compute over gloo on CPU (NCCL always does)."""
        ...


class DdpPlanner:
    """ddp: bucketed all-reduces overlapped with backward."""

    def plan(self, p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
        ddp_plan(p, cm, cfg, res, w)

    def unsharded_bytes(self, cfg: RunConfig, res: Resolved, rc: RankClass, param_bytes: int, grad_bytes: int) -> float:
        return autocast_copies(rc, param_bytes)

    def activations_in_flight(self, cfg: RunConfig, res: Resolved, stage: int) -> int:
        return 1

    def optimizer_params(self, res: Resolved, local_params: float, blocks: list[Block]) -> float:
        return local_params

    def ops_estimate(self, s: Strategy, grad_accum: int, n_layers: int) -> int:
        # one all-reduce a block: a model whose blocks hold over 25 MiB of gradients each has
        # more buckets than blocks (and a compression hook 3 ops a bucket), not counted here
        return 2 * (grad_accum + 1) * (n_layers + 2)

    def sharded(self, res: Resolved) -> bool:
        return False

    def overlaps(self, res: Resolved) -> bool:
        return True  # DDP's reducer runs gloo asynchronously


class Zero1Planner(DdpPlanner):
    """zero1: DDP's step, each rank stepping its partition of Adam's state and broadcasting it."""

    def plan(self, p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
        zero1_plan(p, cm, cfg, res, w)

    def optimizer_params(self, res: Resolved, local_params: float, blocks: list[Block]) -> float:
        return largest_partition(local_params, blocks, res.replicas)  # over the DDP process group

    def ops_estimate(self, s: Strategy, grad_accum: int, n_layers: int) -> int:
        # DDP's, plus one broadcast per data-parallel rank (unknown here: not counted)
        return super().ops_estimate(s, grad_accum, n_layers) + 1


class FsdpPlanner:
    """zero, zero2d: FSDP2's per-unit all-gathers and reduce-scatters (one plan)."""

    def plan(self, p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
        zero_plan(p, cm, cfg, res, w)

    def unsharded_bytes(self, cfg: RunConfig, res: Resolved, rc: RankClass, param_bytes: int, grad_bytes: int) -> float:
        if res.shard > 1:
            return fsdp_gathered(cfg, rc, param_bytes, grad_bytes)
        return autocast_copies(rc, param_bytes)  # over one rank nothing is sharded

    def activations_in_flight(self, cfg: RunConfig, res: Resolved, stage: int) -> int:
        return 1

    def optimizer_params(self, res: Resolved, local_params: float, blocks: list[Block]) -> float:
        return local_params

    def ops_estimate(self, s: Strategy, grad_accum: int, n_layers: int) -> int:
        # a unit a micro-step: all-gather, copy-out, forward, again in backward, reduce-scatter, all-reduce;
        # with expert parallelism a layer's all-to-alls and its experts' unit (`expert_parallel`), at most 24 more
        return 8 * grad_accum * (n_layers + 2) + 4 + (24 * grad_accum * n_layers if s.ep > 1 else 0)

    def sharded(self, res: Resolved) -> bool:
        return True

    def overlaps(self, res: Resolved) -> bool:
        return False  # FSDP2 on CPU has no streams: serialized


class PipelinePlanner:
    """pipeline: each stage's schedule of microbatches, its stages plain, DDP or FSDP2."""

    def plan(self, p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
        (virtual_pipeline_plan if res.multi_stage else pipeline_plan)(p, cm, cfg, res, w)

    def unsharded_bytes(self, cfg: RunConfig, res: Resolved, rc: RankClass, param_bytes: int, grad_bytes: int) -> float:
        if res.shard > 1:
            return pipelined_unsharded(rc, param_bytes, grad_bytes)
        return autocast_copies(rc, param_bytes)

    def activations_in_flight(self, cfg: RunConfig, res: Resolved, stage: int) -> int:
        """GPipe holds every microbatch's activations; 1F1B at most P - s on stage s."""
        if cfg.strategy.schedule == "gpipe":
            return res.microbatches
        return min(res.pp - stage, res.microbatches)

    def optimizer_params(self, res: Resolved, local_params: float, blocks: list[Block]) -> float:
        return local_params

    def ops_estimate(self, s: Strategy, grad_accum: int, n_layers: int) -> int:
        units = math.ceil(n_layers / s.pp) + 2  # of one rank, with the embedding and the head
        v = s.stages_per_rank  # each of a rank's stages runs every microbatch: its passes and sends
        sharded = (s.degree or 1) > 1
        per_microbatch = 4 * units + 6 * v if sharded else 6 * v  # a sharded stage runs each block's ops
        if s.schedule in ZERO_BUBBLE:  # the backward's W pass besides its I
            per_microbatch += units if sharded else v
        if s.ep > 1:  # an MoE layer's all-to-alls and its experts' unit (`expert_parallel`), at most 24 more
            per_microbatch += 24 * units
        return grad_accum * s.pp * (s.microbatches * per_microbatch + 4 * units) + s.pp

    def sharded(self, res: Resolved) -> bool:
        return res.shard > 1

    def overlaps(self, res: Resolved) -> bool:
        return res.shard == 1  # replicated stages run DDP, whose reducer runs gloo asynchronously


PLANNERS: dict[str, Planner] = {
    DDP.name: DdpPlanner(),
    ZERO.name: FsdpPlanner(),
    ZERO2D.name: FsdpPlanner(),
    PIPELINE.name: PipelinePlanner(),
    ZERO1.name: Zero1Planner(),
}
