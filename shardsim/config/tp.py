"""What tensor parallelism asks of a model and a cluster: the checks `resolve` makes of `tp`.

Megatron-style tensor parallelism splits attention by heads, the MLP by its inner size and the
vocabulary by rows; with sequence parallelism the norms and residuals are split along the
sequence. Grouped-query attention with fewer key/value heads than `tp` replicates each key/value
head over tp / kv ranks (as Megatron-LM does): allowed when kv divides tp.
"""

from __future__ import annotations

from shardsim.core.errors import ConfigError
from shardsim.specs.model.arch import Arch


def tp_group_span(tp: int, dp: int, tp_inner: bool) -> int:
    """Consecutive ranks one tensor-parallel group's ranks lie within: tp when they are
    consecutive (mesh pp,dp,tp), a stage's tp × dp ranks when they are dp apart."""
    return tp if tp_inner or dp == 1 else tp * dp


def check_tp(
    *,
    tp: int,
    sequence_parallel: bool,
    async_tp: bool,
    tp_inner: bool,
    across_nodes: bool,
    world: int,
    pp: int,
    arch: Arch | None,
    devices_per_node: int | None,
    backend: str,
    where: str | None,
    compiled: bool = True,
) -> None:
    """Refuse (ConfigError naming the field) a tensor-parallel degree that cannot work here."""
    if world % (pp * tp):
        span = f"tp {tp} x pp {pp}" if pp > 1 else f"tp {tp}"
        raise ConfigError(f"{span} does not divide the world size {world}", where=where, field="tp")
    if arch is None:
        raise ConfigError(
            "tensor parallelism needs a described model (a family with heads and an FFN), not an import path",
            where=where,
            field="tp",
        )
    if arch.spec.tp_plan is None:
        raise ConfigError(
            f"tensor parallelism applies to the transformer families, not {arch.family}", where=where, field="tp"
        )
    if arch.heads % tp:
        raise ConfigError(f"tp {tp} does not divide the model's {arch.heads} attention heads", where=where, field="tp")
    kv = arch.kv
    if kv % tp and tp % kv:
        raise ConfigError(
            f"tp {tp} and the model's {kv} key/value heads: neither divides the other (with fewer key/value heads "
            "than tp, each is replicated over tp / kv ranks, which needs kv to divide tp)",
            where=where,
            field="tp",
        )
    if arch.ffn_size % tp:
        raise ConfigError(f"tp {tp} does not divide the model's FFN size {arch.ffn_size}", where=where, field="tp")
    if arch.mla:
        raise ConfigError("tensor parallelism of latent attention is not modelled", where=where, field="tp")
    for name, size in (
        ("expert FFN size", arch.expert_ffn_size if arch.experts else 0),
        ("shared FFN size", arch.shared_ffn),
    ):
        if size % tp:
            raise ConfigError(f"tp {tp} does not divide the model's {name} {size}", where=where, field="tp")
    if sequence_parallel and arch.tokens % tp:
        raise ConfigError(
            f"sequence parallelism splits the {arch.tokens} tokens of a sample over tp {tp} ranks: it does not divide",
            where=where,
            field="sequence_parallel",
        )
    if async_tp and backend != "nccl":
        raise ConfigError("asyncTP needs NCCL (CUDA symmetric memory)", where=where, field="async_tp")
    if async_tp and not compiled:
        why = "asyncTP is inductor's micro-pipeline pass: it needs compile (torch.compile; torchtitan refuses it too)"
        raise ConfigError(why, where=where, field="async_tp")
    span = tp_group_span(tp, world // (pp * tp), tp_inner)
    if devices_per_node and not across_nodes and devices_per_node % span:
        raise ConfigError(
            f"a tensor-parallel group of {tp} ranks would span nodes ({devices_per_node} GPUs per node"
            + ("" if tp_inner else ", data parallelism innermost")
            + "); set tp_across_nodes to allow it",
            where=where,
            field="tp",
        )
