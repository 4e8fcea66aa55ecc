"""llama: Llama 2/3 and the llama-shaped models (RMSNorm, no biases, SwiGLU MLP, rotary positions,
grouped-query attention). A llama-shaped Hugging Face ``model_type`` is one entry of `HF_TYPES`:
the shared mapper with what that type changes (q/k/v biases, an explicit head width, q/k norms,
tied embeddings, the defaults its config.json leaves out).

Named simplifications: Mistral's and Qwen's sliding window, Gemma's logit soft-capping and its
norms after attention and the MLP, and Gemma's GELU gate (costed as SwiGLU's: same matrices and
FLOPs) are not modelled; such keys are named once as not modelled when a config.json is read.
Phi-3's fused qkv and gate_up projections hold the same parameters as the separate ones."""

from __future__ import annotations

from functools import partial
from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.specs.model.families.plans import SWIGLU_PLAN
from shardsim.specs.model.hf_keys import HFKeys
from shardsim.specs.model.spec import HFMapper, ModelSpec, Traits


def llama_fields(
    k: HFKeys,
    *,
    qkv_bias: bool = False,
    qk_norm: bool = False,
    tied: bool = False,
    vocab: int | None = None,
    max_positions: int | None = None,
) -> dict[str, Any]:
    """The `Arch` fields of a llama-shaped config.json; the keyword arguments are what a type
    changes (its q/k/v biases and q/k norms, and its defaults for keys its file may leave out)."""
    hidden, heads = k.int("hidden_size"), k.int("num_attention_heads")
    even = hidden // heads if heads else 0
    head_dim = k.int("head_dim", default=even)
    for name in ("attention_bias", "mlp_bias"):
        if k.flag(name, False):
            raise ConfigError("biases are not modelled for the llama family", where=k.where, field=k.prefix + name)
    return dict(
        hidden=hidden,
        layers=k.int("num_hidden_layers"),
        heads=heads,
        kv_heads=k.int("num_key_value_heads", default=heads),
        ffn=k.int("intermediate_size"),
        vocab=k.int("vocab_size", default=vocab),
        seq_len=k.seq_len("max_position_embeddings", default=max_positions),
        tied_embeddings=k.flag("tie_word_embeddings", tied),
        head_size=0 if head_dim == even else head_dim,
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
    )


# Gemma 3's text model (``gemma3_text``), its config.json leaving out what Transformers' defaults hold
_gemma3_text = partial(llama_fields, qk_norm=True, tied=True, vocab=262_208, max_positions=131_072)


def _gemma3(k: HFKeys) -> dict[str, Any]:
    """A Gemma 3 image-text model: its text model (``text_config``); the vision tower is not modelled."""
    return _gemma3_text(k.nested("text_config"))


HF_TYPES: dict[str, HFMapper] = {
    "llama": llama_fields,
    "mistral": llama_fields,
    "qwen2": partial(llama_fields, qkv_bias=True),
    "qwen3": partial(llama_fields, qk_norm=True),
    "gemma2": partial(llama_fields, tied=True),
    "gemma3_text": _gemma3_text,
    "gemma3": _gemma3,
    "phi3": llama_fields,
}

SPEC = ModelSpec(
    name="llama",
    traits=Traits("rmsnorm", False, "swiglu", "rope", True, "text"),
    embed="tokens",
    layer="transformer",
    head="lm",
    tp_plan=SWIGLU_PLAN,
    hf_types=HF_TYPES,
)
