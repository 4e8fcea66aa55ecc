"""What expert parallelism asks of a strategy and a model: the checks of `ep` and `etp`.

Expert parallelism shards each MoE layer's routed experts over groups of `ep` ranks (experts / ep
each) and sends every routed token to its expert's rank and back by all-to-all. As torchtitan
composes it (its ``ParallelDims`` with ``ep``, ``efsdp`` and ``etp``), the EP ranks are taken
from the ranks FSDP2 shards over: the rest of the model is sharded over all the data-parallel
ones, the experts over the ranks left after EP (efsdp); a kind that does not shard with FSDP2
(ddp, zero1) is refused. With tensor parallelism `etp` (torchtitan's
``expert_tensor_parallel_degree``, 1 or tp) says where EP's ranks come from: etp = tp, from the
data-parallel ranks (ep divides the degree) and the experts also tensor-parallel; etp = 1, its
default and the only one its current version keeps, from dp_shard x tp (ep divides degree x tp)
and the experts whole. A pipeline takes its EP ranks from each stage's FSDP2-sharded ranks alike
(pp outermost), under a schedule that runs whole backward passes (a zero-bubble schedule's split
backward is not planned with EP). Context parallelism with EP is not planned.
"""

from __future__ import annotations

from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.specs.model.arch import Arch
from shardsim.specs.schedules import ZERO_BUBBLE
from shardsim.specs.strategies.base import StrategySpec


def check_ep_kind(ep: object, s: Any, spec: StrategySpec, where: str | None) -> None:
    """Refuse (ConfigError naming `ep`) expert parallelism on a kind it does not compose with (yet):
    one that does not shard with FSDP2 (ddp, zero1), a zero-bubble pipeline schedule, context
    parallelism, tensor parallelism in another mesh order than torchtitan's; and `etp` (`check_etp`)."""
    if not isinstance(ep, int) or ep == 1:
        if s.etp != 1:
            raise ConfigError(f"etp {s.etp} applies with expert parallelism (ep > 1)", where=where, field="etp")
        return
    if spec.is_pipeline and s.schedule in ZERO_BUBBLE:
        why = f"expert parallelism with the {s.schedule} schedule (a split backward) is not built yet: use 1f1b, "
        why += "gpipe, interleaved-1f1b or looped-bfs"
    elif not spec.fsdp and not spec.is_pipeline:
        why = (
            "expert parallelism takes its ranks from those FSDP2 shards over (torchtitan's dp_shard x ep); "
            f"{spec.name} does not shard with FSDP2: use zero or zero2d"
        )
    elif s.cp != 1:
        why = "expert parallelism with context parallelism is not built yet"
    elif s.tp != 1 and s.mesh_order != "pp,dp,tp":
        why = "expert parallelism with tensor parallelism lays out torchtitan's mesh, tp innermost: mesh_order pp,dp,tp"
    else:
        check_etp(s.etp, s.ep, s.tp, where)
        return
    raise ConfigError(why, where=where, field="ep")


def check_etp(etp: object, ep: int, tp: int, where: str | None) -> None:
    """Refuse (ConfigError naming `etp`) an experts' tensor-parallel degree torchtitan does not
    build: neither 1 nor tp, or with etp 1 an EP group that neither holds whole tensor-parallel
    groups nor lies in one (ep and tp each dividing the other)."""
    if etp not in (1, tp):
        why = f"etp {etp} is neither 1 (EP borrows tensor-parallel ranks) nor tp {tp} (the experts tensor-parallel)"
        raise ConfigError(why, where=where, field="etp")
    if etp == 1 and ep % tp and tp % ep:
        why = f"with etp 1 the EP group of {ep} takes whole tensor-parallel groups of {tp} or lies in one: "
        why += "make ep a multiple or a divisor of tp, or set etp to tp"
        raise ConfigError(why, where=where, field="etp")


def check_ep(
    *, ep: int, shard: int, arch: Arch | None, where: str | None, pipeline: bool = False, tp: int = 1, etp: int = 1
) -> None:
    """Refuse (ConfigError naming `ep`) an expert-parallel degree that does not fit the model or the
    shard degree (of a `pipeline`'s stages) x `tp` where the experts are not tensor-parallel
    (`etp` 1)."""
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
    borrowed = tp if etp == 1 else 1  # torchtitan's sparse region: dp_shard x tp / etp
    if borrowed > 1 and arch.tokens % tp:
        why = f"with etp 1 each of tp {tp} ranks dispatches a tp-th of the tokens: tp does not divide {arch.tokens}"
        raise ConfigError(why, where=where, field="etp")
    if (shard * borrowed) % ep:
        span = f"the {shard} data-parallel ranks a parameter is sharded over (the degree)"
        if borrowed > 1:
            span = f"the {shard * borrowed} ranks of degree {shard} x tp {tp} (etp 1: EP borrows tensor-parallel ranks)"
        raise ConfigError(f"ep {ep} does not divide {span}", where=where, field="ep")
