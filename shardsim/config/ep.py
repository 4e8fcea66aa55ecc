"""What expert parallelism asks of a strategy and a model: the checks of `ep`.

Expert parallelism shards each MoE layer's routed experts over groups of `ep` data-parallel ranks
(experts / ep each) and sends every routed token to its expert's rank and back by all-to-all. As
torchtitan composes it (its ``ParallelDims`` with ``ep`` and ``efsdp``), the EP ranks are taken
from the ranks FSDP2 shards over: the rest of the model is sharded over all of them (dp_shard x
ep), the experts over the data-parallel ranks left after EP (dp_shard); so `ep` divides the shard
degree, and a kind that does not shard with FSDP2 (ddp, zero1) is refused. A pipeline takes its EP
ranks from each stage's FSDP2-sharded data-parallel ranks alike (pp outermost), under a schedule
that runs whole backward passes (a zero-bubble schedule's split backward is not planned with EP).
"""

from __future__ import annotations

from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.specs.model.arch import Arch
from shardsim.specs.schedules import ZERO_BUBBLE
from shardsim.specs.strategies.base import StrategySpec


def check_ep_kind(ep: object, s: Any, spec: StrategySpec, where: str | None) -> None:
    """Refuse (ConfigError naming `ep`) expert parallelism on a kind it does not compose with (yet):
    one that does not shard with FSDP2 (ddp, zero1), a zero-bubble pipeline schedule, tensor or
    context parallelism."""
    if not isinstance(ep, int) or ep == 1:
        return
    if spec.is_pipeline and s.schedule in ZERO_BUBBLE:
        why = f"expert parallelism with the {s.schedule} schedule (a split backward) is not built yet: use 1f1b, "
        why += "gpipe, interleaved-1f1b or looped-bfs"
    elif not spec.fsdp and not spec.is_pipeline:
        why = (
            "expert parallelism takes its ranks from those FSDP2 shards over (torchtitan's dp_shard x ep); "
            f"{spec.name} does not shard with FSDP2: use zero or zero2d"
        )
    elif s.tp != 1 or s.cp != 1:
        why = f"expert parallelism with {'tensor' if s.tp != 1 else 'context'} parallelism is not built yet"
        why += " (torchtitan takes the EP ranks from dp_shard x cp x tp, its routed experts not tensor-parallel)"
    else:
        return
    raise ConfigError(why, where=where, field="ep")


def check_ep(*, ep: int, shard: int, arch: Arch | None, where: str | None, pipeline: bool = False) -> None:
    """Refuse (ConfigError naming `ep`) an expert-parallel degree that does not fit the model or the
    shard degree (of a `pipeline`'s stages)."""
    if arch is None:
        raise ConfigError("expert parallelism needs a described model with experts, not an import path",
                          where=where, field="ep")  # fmt: skip
    if arch.experts < 1:
        why = f"expert parallelism shards a mixture of experts; this {arch.family} model has no experts"
        raise ConfigError(why, where=where, field="ep")
    if arch.experts % ep:
        raise ConfigError(f"ep {ep} does not divide the model's {arch.experts} experts", where=where, field="ep")
    if pipeline and shard == 1:
        why = "expert parallelism takes its ranks from a pipeline stage's FSDP2 shard degree; degree 1 (DDP stages) "
        why += "has none: give degree a multiple of ep"
        raise ConfigError(why, where=where, field="ep")
    if shard % ep:
        why = f"ep {ep} does not divide the {shard} data-parallel ranks a parameter is sharded over (the degree)"
        raise ConfigError(why, where=where, field="ep")
