"""What the runtime refuses of a tensor-parallel configuration that the simulator accepts
(torch-free: the launcher checks before anything is spawned)."""

from __future__ import annotations

from shardsim.core.errors import ConfigError
from shardsim.specs.model.arch import Arch

ASYNC_TP_REFUSED = (
    "asyncTP is modelled by the simulator only: PyTorch runs it through torch.compile's micro-pipeline "
    "pass (torch._inductor.config._micro_pipeline_tp), which the runtime's eager step does not use"
)


def check_runtime_tp(arch: Arch | None, tp: int, async_tp: bool = False) -> None:
    """ConfigError (one line) for what the runtime refuses of a tensor-parallel configuration
    `resolve` accepts: asyncTP; a model with experts (its MoE layers have no tensor-parallel plan
    in the runtime); fewer key/value heads than tp (GQA replicating a key/value head
    over several TP ranks is modelled by the simulator only); q/k norms (their weights' gradients
    would differ by rank, each rank norming its own heads)."""
    if async_tp:
        raise ConfigError(ASYNC_TP_REFUSED, field="async_tp")
    if arch is not None and tp > 1 and arch.kv % tp:
        raise ConfigError(
            f"tp {tp} exceeds the model's {arch.kv} key/value heads: the runtime does not replicate "
            "key/value heads over tensor-parallel ranks (the simulator models it)",
            field="tp",
        )
    if arch is not None and tp > 1 and arch.experts:
        why = "the runtime's MoE layers are not tensor parallel (their experts shard with ep); run them with tp 1"
        raise ConfigError(why, field="tp")
    if arch is not None and tp > 1 and arch.qk_norm:
        raise ConfigError(
            "q/k norms under tensor parallelism are modelled by the simulator only: the runtime does not "
            "reduce their weights' gradients over the tensor-parallel ranks",
            field="tp",
        )
