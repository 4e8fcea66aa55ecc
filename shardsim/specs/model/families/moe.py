"""moe: llama-shaped transformers whose MLP is a mixture of experts on every MoE layer (a router
sends each token to `top_k` of `experts` SwiGLU experts, beside an optional shared expert; dense
layers first or interleaved as `Arch.dense_layers` and `Arch.moe_every` say)."""

from __future__ import annotations

from shardsim.specs.model.families.plans import SWIGLU_PLAN
from shardsim.specs.model.spec import HFMapper, ModelSpec, Traits

HF_TYPES: dict[str, HFMapper] = {}

SPEC = ModelSpec(
    name="moe",
    traits=Traits("rmsnorm", False, "swiglu", "rope", True, "text"),
    embed="tokens",
    layer="transformer",
    head="lm",
    tp_plan=SWIGLU_PLAN,
    hf_types=HF_TYPES,
    moe=True,
)
