"""The strategy kinds, one module each, behind one protocol (`base.StrategyKind`), and their
registry `STRATEGIES`: name → kind, in the order sweeps and tables list them."""

from __future__ import annotations

from shardsim.simulator.strategies.kinds.base import StrategyKind
from shardsim.simulator.strategies.kinds.ddp import DDP
from shardsim.simulator.strategies.kinds.pipeline import PIPELINE
from shardsim.simulator.strategies.kinds.zero import ZERO
from shardsim.simulator.strategies.kinds.zero2d import ZERO2D

STRATEGIES: dict[str, StrategyKind] = {k.name: k for k in (DDP, ZERO, ZERO2D, PIPELINE)}
# FSDP1's ShardingStrategy names → (kind, reshard_after_forward)
FSDP_SHARDING = {name: (k, raf) for k, v in STRATEGIES.items() for name, raf in v.fsdp_sharding.items()}
DEFAULT_KIND = ZERO.name  # a configuration's strategy unless it names one

__all__ = ["DDP", "DEFAULT_KIND", "FSDP_SHARDING", "PIPELINE", "STRATEGIES", "ZERO", "ZERO2D", "StrategyKind"]
