"""What context parallelism asks of a strategy, a model and a cluster: the checks of `cp`.

Context parallelism splits each sample's sequence over `cp` ranks and runs attention as PyTorch's
ring attention (`torch.distributed.tensor.experimental.context_parallel`). Its load-balanced
sharding of causal attention cuts the sequence into 2·cp chunks and gives rank i chunks i and
2·cp-1-i (`_HeadTailLoadBalancer`, which asserts that 2·cp divides the sequence length); the ring
covers scaled-dot-product attention with a causal mask only when load-balanced (a bidirectional
model has nothing it balances). As torchtitan composes it, parameters are sharded with FSDP2 over
dp_shard × cp (its ``dp_shard_cp`` mesh), so a kind that does not shard with FSDP2 (ddp, zero1)
is refused; pipelines shard their stages over cp.
"""

from __future__ import annotations

from shardsim.core.errors import ConfigError
from shardsim.specs.model.arch import Arch
from shardsim.specs.strategies.base import StrategySpec


def check_cp_kind(cp: object, cp_rotate: object, spec: StrategySpec, where: str | None) -> None:
    """Refuse (ConfigError naming the field) context parallelism on a kind it does not compose with,
    and a rotate method without it."""
    if cp_rotate == "alltoall" and cp == 1:
        raise ConfigError("cp_rotate applies with cp > 1", where=where, field="cp_rotate")
    if isinstance(cp, int) and cp > 1 and not (spec.fsdp or spec.is_pipeline):
        why = (
            f"context parallelism shards parameters with FSDP2 over dp_shard x cp (torchtitan's dp_shard_cp); "
            f"{spec.name} does not shard with FSDP2: use zero, zero2d or pipeline"
        )
        raise ConfigError(why, where=where, field="cp")


def check_cp(
    *,
    cp: int,
    world: int,
    pp: int,
    tp: int,
    arch: Arch | None,
    attention: str,
    profiled: bool,
    sequence_parallel: bool,
    where: str | None,
) -> None:
    """Refuse (ConfigError naming the field) a context-parallel degree that cannot work here."""
    if world % (pp * tp * cp):
        span = " x ".join(f"{n} {v}" for n, v in (("pp", pp), ("tp", tp), ("cp", cp)) if v > 1)
        raise ConfigError(f"{span} does not divide the world size {world}", where=where, field="cp")
    if arch is None:
        why = "context parallelism needs a described model (a family with attention), not an import path"
        raise ConfigError(why, where=where, field="cp")
    if not arch.spec.transformer or arch.traits.tokens != "text":
        why = f"context parallelism shards a text model's sequence; {arch.family} has no sequence of tokens to shard"
        raise ConfigError(why, where=where, field="cp")
    if not arch.traits.causal:
        why = (
            f"context parallelism's load-balanced ring attention needs causal attention; {arch.family} attends "
            "bidirectionally"
        )
        raise ConfigError(why, where=where, field="cp")
    if arch.tokens % (2 * cp):
        why = (
            f"load-balanced causal sharding cuts the sequence into 2 x cp = {2 * cp} chunks: it does not divide "
            f"the {arch.tokens} tokens of a sample"
        )
        raise ConfigError(why, where=where, field="cp")
    if sequence_parallel and (arch.tokens // cp) % tp:
        why = (
            f"sequence parallelism splits a context-parallel rank's {arch.tokens // cp} tokens over tp {tp} ranks: "
            "it does not divide"
        )
        raise ConfigError(why, where=where, field="sequence_parallel")
    if attention in ("math", "eager"):
        why = f"PyTorch's ring attention runs the flash, efficient or cuDNN kernels, not {attention} (unfused) "
        why += "attention"
        raise ConfigError(why, where=where, field="attention")
    if profiled:
        why = "a profile measures blocks over whole sequences; context parallelism's share of them is not measured"
        raise ConfigError(why, where=where, field="profile")
