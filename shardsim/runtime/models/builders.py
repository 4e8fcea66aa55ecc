"""The runtime's builder of each model family, keyed by the family's name as `specs.model.registry`
keys its `ModelSpec` (a test checks that the keys match)."""

from __future__ import annotations

from collections.abc import Callable

from shardsim.runtime.models.checks import check_runtime_tp
from shardsim.runtime.models.moe import build_moe
from shardsim.runtime.models.transformer import ShardsimModel, build_mlp, build_text, build_vit
from shardsim.specs.model.arch import Arch

BUILDERS: dict[str, Callable[[Arch, int], ShardsimModel]] = {
    "gpt": build_text,
    "llama": build_text,
    "mpt": build_text,
    "bert": build_text,
    "vit": build_vit,
    "mlp": build_mlp,
    "moe": build_moe,
}


def build_model(a: Arch, qkv_groups: int = 1) -> ShardsimModel:
    """The torch model of an architecture (build under `torch.device('meta')` to cost it free).
    `qkv_groups`: the tensor-parallel degree the fused qkv rows are grouped for (1: [q, k, v]);
    what the runtime refuses of it is refused first (`check_runtime_tp`: ConfigError naming `tp`)."""
    check_runtime_tp(a, qkv_groups)
    return BUILDERS[a.family](a, qkv_groups)
