"""mpt: MosaicML MPT (LayerNorm without bias, no biases, GELU MLP, ALiBi positions, the LM head
tied to the token embedding)."""

from __future__ import annotations

from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.specs.model.families.plans import GELU_PLAN
from shardsim.specs.model.hf_keys import HFKeys
from shardsim.specs.model.spec import ModelSpec, Traits


def _mpt(k: HFKeys) -> dict[str, Any]:
    hidden = k.int("d_model")
    if not k.flag("no_bias", True):
        raise ConfigError(
            "an MPT with biases is not modelled (the mpt family has none)", where=k.where, field="no_bias"
        )
    return dict(
        hidden=hidden,
        layers=k.int("n_layers"),
        heads=k.int("n_heads"),
        ffn=k.int("expansion_ratio", default=4) * hidden,
        vocab=k.int("vocab_size"),
        seq_len=k.seq_len("max_seq_len"),
        tied_embeddings=True,  # MPT always ties its LM head to the token embedding
    )


SPEC = ModelSpec(
    name="mpt",
    traits=Traits("layernorm-nobias", False, "gelu", "alibi", True, "text"),
    embed="tokens",
    layer="transformer",
    head="lm",
    tp_plan=GELU_PLAN,
    hf_types={"mpt": _mpt},
)
