"""How far the simulator goes: the bounds beyond which it refuses a configuration, checked
before any work (docs/simulator.md#how-far-it-goes).

A prediction's cost grows with the cluster (a collective's phases are planned over every link,
then merged into a few resources: `network.linkgroups`) and with its plan's ops (the simpy events:
grad_accum x microbatches x layers). Within the bounds a prediction takes seconds and well under
2 GB (tests/unit/test_scale.py times one of 16,384 GPUs); beyond them it refuses in one line.
"""

from __future__ import annotations

import math

from shardsim.simulator.config import RunConfig
from shardsim.simulator.errors import ConfigError

MAX_WORLD = 65_536  # devices in one cluster
MAX_PLAN_OPS = 100_000  # ops of one step's plan, as `plan_ops_estimate` counts them


def world_refusal(world: int) -> str | None:
    """Why a cluster of `world` devices is beyond the simulator, or None."""
    if world > MAX_WORLD:
        return f"{world:,} devices is beyond the simulator's bound of {MAX_WORLD:,} devices per cluster"
    return None


def plan_ops_estimate(cfg: RunConfig, n_layers: int) -> int:
    """About how many ops the plan of one step of `cfg` (normalized by resolve) holds: between
    one and four times as many as it does (tests/unit/test_scale.py), without building it."""
    s, K, L = cfg.strategy, cfg.grad_accum, n_layers
    if s.kind == "ddp":
        return 2 * (K + 1) * (L + 2)
    if s.kind != "pipeline":
        return 6 * K * (L + 2) + 4
    units = math.ceil(L / s.pp) + 2  # of one stage, with the embedding and the head
    per_microbatch = 4 * units + 6 if (s.degree or 1) > 1 else 6  # a sharded stage runs each block's ops
    return K * s.pp * (s.microbatches * per_microbatch + 4 * units) + s.pp


def plan_refusal(cfg: RunConfig, n_layers: int) -> str | None:
    """Why the plan of `cfg` (normalized by resolve) is beyond the simulator, or None."""
    ops = plan_ops_estimate(cfg, n_layers)
    if ops > MAX_PLAN_OPS:
        s = cfg.strategy
        size = f"grad_accum {cfg.grad_accum}" + (f" x {s.microbatches} microbatches" if s.kind == "pipeline" else "")
        return (
            f"a step of about {ops:,} simulated ops ({size}) is beyond the simulator's bound of "
            f"{MAX_PLAN_OPS:,}; lower grad_accum or microbatches"
        )
    return None


def check_scale(cfg: RunConfig, world: int, n_layers: int) -> None:
    """Raise ConfigError (one line naming the bound) when `cfg` on `world` devices is beyond the simulator."""
    why = world_refusal(world)
    if why:
        raise ConfigError(why, field="nodes")
    why = plan_refusal(cfg, n_layers)
    if why:
        raise ConfigError(why, field="grad_accum" if cfg.strategy.kind != "pipeline" else "microbatches")
