"""How far the simulator goes beyond a configuration's own bounds (`specs.bounds`): a step's plan,
one collective's message and a sweep's space, each refused in one line before any work
(docs/simulator.md#how-far-it-goes).

A prediction's cost grows with the cluster (a collective's phases are planned over every link,
then merged into a few resources: `network.linkgroups`) and with its plan's ops (the simpy events:
grad_accum x microbatches x layers). Within the bounds a prediction takes seconds and well under
2 GB (tests/unit/test_scale.py times one of 16,384 GPUs); beyond them it refuses in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardsim.core.errors import ConfigError
from shardsim.simulator.strategies.deepspeed_stage3 import stage3_ops_estimate
from shardsim.simulator.strategies.deepspeed_zero import stage_of
from shardsim.simulator.strategies.planners import PLANNERS
from shardsim.specs.bounds import world_refusal

if TYPE_CHECKING:
    from shardsim.config import RunConfig

# ops of one step's plan, as `plan_ops_estimate` counts them: every layout of llama-3.1-70b on
# 16 x p5.48xlarge and of llama-3.1-405b on 64 x p5.48xlarge at 8,192 tokens (pp up to 16, 64
# microbatches, 4 stages per rank; at most 191,376) is within it; the largest predict in 1.2-1.6 s
# of CPU and 186 MiB on a 2-core machine. Those beyond it at 131,072 tokens with cp up to 16 do
# not fit in memory, so a sweep keeps them as rows of their memory (experiments/readings/op-bound.md)
MAX_PLAN_OPS = 200_000
MAX_MESSAGE_BYTES = 2**40  # one collective's message (1 TiB: the fp32 gradients of a 270 B model)
MAX_SWEEP_SPACE = 50_000  # configurations a sweep's requested space holds, valid or not, before any is checked
SWEEP_CONFIRM_ABOVE = 1_000  # valid configurations a sweep predicts without asking (--yes)


def plan_ops_estimate(cfg: RunConfig, n_layers: int) -> int:
    """About how many ops the plan of one step of `cfg` (normalized by resolve) holds: between
    one and four times as many as it does (tests/unit/test_scale.py; library deepspeed's stage 3
    an upper bound, `stage3_ops_estimate`), without building it. Not counted, so under the plan
    there: DDP's gradient buckets beyond one a block (unsharded gradients, ddp, zero1 and a
    pipeline's unsharded stages, of blocks over 25 MiB of gradients each: a large vocabulary's
    embedding and head). Such a step holds at most its gradients over 25 MiB buckets more, a
    few thousand on an 80 GiB device."""
    s = cfg.strategy
    planned = PLANNERS[s.kind].ops_estimate(s, cfg.grad_accum, n_layers)
    if cfg.library == "deepspeed" and stage_of(cfg) == 3:
        planned = stage3_ops_estimate(cfg.grad_accum, n_layers)
    return planned + tp_ops_estimate(cfg, n_layers) + cp_ops_estimate(cfg, n_layers)


def tp_ops_estimate(cfg: RunConfig, n_layers: int) -> int:
    """The ops tensor parallelism adds to a step's plan: each block's pass becomes its own op (no
    longer run through with its neighbours), followed by its collectives (`strategies.tensor_parallel`:
    a layer's 2 all-reduces a pass, or 4 all-gathers and reduce-scatters with sequence parallelism,
    its forward's again where full checkpointing recomputes it), in every microbatch."""
    s = cfg.strategy
    if s.tp == 1:
        return 0
    per_pass = 4 if s.sequence_parallel else 2
    recompute = per_pass if cfg.checkpointing == "full" else 0
    passes = cfg.grad_accum * (s.microbatches if s.spec.is_pipeline else 1)
    return passes * ((n_layers + 2) * (2 + 2 * per_pass + recompute) + 4)


def cp_ops_estimate(cfg: RunConfig, n_layers: int) -> int:
    """The ops context parallelism adds to a step's plan: each block's pass its own op, and each
    layer's pass its attention rounds and their collectives (`strategies.context_parallel`: cp
    rounds and a last op a pass, the forward's after its all-gather one op; the K/V rotation,
    one all-gather or cp - 1 ring passes, a pass and again where full checkpointing recomputes
    the forward; cp gradient passes in backward), in every microbatch."""
    s = cfg.strategy
    if s.cp == 1:
        return 0
    rotation = 1 if s.cp_rotate == "allgather" else s.cp - 1
    recompute = rotation if cfg.checkpointing == "full" else 0
    fwd_rounds = min(s.cp, 2) if s.cp_rotate == "allgather" else s.cp
    per_layer = (fwd_rounds + 1) + (s.cp + 1) + 2 * rotation + s.cp + recompute
    passes = cfg.grad_accum * (s.microbatches if s.spec.is_pipeline else 1)
    return passes * ((n_layers + 2) * 2 + n_layers * per_layer)


@dataclass(frozen=True)
class PlanRefusal:
    """Why a step's plan is beyond the simulator, and the setting to lower."""

    field: str  # layers | microbatches | grad_accum
    message: str


def plan_refusal(cfg: RunConfig, n_layers: int) -> PlanRefusal | None:
    """Why the plan of `cfg` (normalized by resolve) is beyond the simulator, or None. It names
    the layers when one micro-step of one microbatch is beyond already, else the microbatches of
    a pipeline when one micro-step is, else grad_accum."""
    ops = plan_ops_estimate(cfg, n_layers)
    if ops <= MAX_PLAN_OPS:
        return None
    s = cfg.strategy
    pipeline = s.spec.is_pipeline
    one_step = cfg.replace(grad_accum=1)
    one_microbatch = one_step.replace(strategy=s.replace(microbatches=1)) if s.spec.is_pipeline else one_step
    if plan_ops_estimate(one_microbatch, n_layers) > MAX_PLAN_OPS:
        field = "layers"
    elif pipeline and plan_ops_estimate(one_step, n_layers) > MAX_PLAN_OPS:
        field = "microbatches"
    else:
        field = "grad_accum"
    size = f"{n_layers:,} layers x grad_accum {cfg.grad_accum:,}" + (
        f" x {s.microbatches:,} microbatches" if pipeline else ""
    )
    lower = {"layers": "fewer layers", "microbatches": "fewer microbatches", "grad_accum": "a lower grad_accum"}
    return PlanRefusal(
        field,
        f"a step of about {ops:,} simulated ops ({size}) is beyond the simulator's bound of {MAX_PLAN_OPS:,}; "
        f"{lower[field]}",
    )


def check_world(world: int) -> None:
    """Raise ConfigError (one line naming the bound) when a cluster of `world` devices is beyond the simulator."""
    why = world_refusal(world)
    if why:
        raise ConfigError(why, field="nodes")


def check_plan(cfg: RunConfig, n_layers: int) -> None:
    """Raise ConfigError (one line naming the bound) when the step's plan of `cfg` is beyond the
    simulator. Checked before a plan is built, not before memory: a step that does not fit is
    never planned (`predict`'s `prune_unfit`, a sweep's rows), so no bound keeps it out."""
    too_big = plan_refusal(cfg, n_layers)
    if too_big:
        raise ConfigError(too_big.message, field=too_big.field)
