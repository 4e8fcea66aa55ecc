"""Strategies: each kind (`kinds`: ddp, zero, zero2d, pipeline) owns what the simulator, the
sweep and the runtime ask of it, behind one protocol, in the registry `STRATEGIES`. The plans
of one training step as PyTorch runs it are built by `ddp`, `fsdp` (zero, zero2d) and
`pipeline` (whose stages run DDP or FSDP2), through `build.build_plan`; `steps` holds what they
share."""

from shardsim.spec.strategies import STRATEGIES, StrategyKind

__all__ = ["STRATEGIES", "StrategyKind"]
