"""Strategies: the plans of one training step as PyTorch runs it, built by `ddp`, `fsdp` (zero,
zero2d), `pipeline` (whose stages run DDP or FSDP2) and `zero1`, through `build.build_plan`;
`steps` holds what they share. Each kind's planner (its plan, what a rank holds, its op count)
is in `planners.PLANNERS`, under the names of the kinds' specs (`shardsim.specs.strategies`)."""
