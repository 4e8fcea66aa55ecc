"""bert: a bidirectional text encoder, pre-LN (BERT itself is post-LN: same parameters and FLOPs;
the token-type embeddings, the embedding LayerNorm and the pooler are left out, 0.3 % of
BERT-large)."""

from __future__ import annotations

from typing import Any

from shardsim.specs.model.families.plans import GELU_PLAN
from shardsim.specs.model.hf_keys import HFKeys
from shardsim.specs.model.spec import ModelSpec, Traits


def _bert(k: HFKeys) -> dict[str, Any]:
    return k.encoder() | k.text(tied=True)


SPEC = ModelSpec(
    name="bert",
    traits=Traits("layernorm", True, "gelu", "learned", False, "text"),
    embed="tokens",
    layer="transformer",
    head="lm",
    tp_plan=GELU_PLAN,
    hf_types={"bert": _bert},
)
