"""gpt: GPT-2 style (LayerNorm, biases, GELU MLP, learned positions), and GPT-NeoX (rotary
positions; its parallel residual runs sequentially: same parameters and FLOPs)."""

from __future__ import annotations

from typing import Any

from shardsim.specs.model.families.plans import GELU_PLAN
from shardsim.specs.model.hf_keys import HFKeys
from shardsim.specs.model.spec import ModelSpec, Traits


def _gpt2(k: HFKeys) -> dict[str, Any]:
    hidden = k.int("n_embd", "hidden_size")
    return dict(
        hidden=hidden,
        layers=k.int("n_layer", "num_hidden_layers"),
        heads=k.int("n_head", "num_attention_heads"),
        ffn=k.int("n_inner", default=4 * hidden),
        vocab=k.int("vocab_size"),
        seq_len=k.seq_len("n_positions", "n_ctx", "max_position_embeddings"),
        tied_embeddings=k.flag("tie_word_embeddings", True),
    )


def _gpt_neox(k: HFKeys) -> dict[str, Any]:
    return k.encoder() | k.text(tied=False) | {"positions": "rope"}


SPEC = ModelSpec(
    name="gpt",
    traits=Traits("layernorm", True, "gelu", "learned", True, "text"),
    embed="tokens",
    layer="transformer",
    head="lm",
    tp_plan=GELU_PLAN,
    hf_types={"gpt2": _gpt2, "gpt_neox": _gpt_neox},
)
