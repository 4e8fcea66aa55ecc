"""moe: llama-shaped transformers whose MLP is a mixture of experts on every MoE layer (a router
sends each token to `top_k` of `experts` SwiGLU experts, beside an optional shared expert; dense
layers first or interleaved as `Arch.dense_layers` and `Arch.moe_every` say), with grouped-query
or multi-head latent attention (DeepSeek's MLA: `Arch.kv_lora_rank`).

Hugging Face ``config.json`` types: ``mixtral``, ``qwen2_moe`` (q/k/v biases, a shared expert
gated by a sigmoid), ``qwen3_moe`` and ``olmoe`` (q/k norms), ``deepseek_v3`` (latent attention,
n_shared_experts shared experts of moe_intermediate_size, the first first_k_dense_replace layers
dense). Named simplifications, each small against the experts' parameters and FLOPs:
- DeepSeek-V3's multi-token-prediction module (num_nextn_predict_layers) is not modelled: the
  published 671 B parameters leave it out too.
- Routing is costed as a softmax and a top-k: DeepSeek's sigmoid scores, its node-limited routing
  (n_group, topk_group), its auxiliary-loss-free bias (e_score_correction_bias: a buffer of one
  figure per expert, no parameter) and routed_scaling_factor are not modelled.
- YaRN's rotary scaling (rope_scaling) changes no FLOP that is counted; not modelled.
- OLMoE's q and k norms normalize the whole projection (2 x hidden weights), costed as per-head
  norms (Qwen3's: 2 x head_size weights): the same elements normalized.
- Qwen's mlp_only_layers is read where it is a leading run of layers (dense first); Qwen's
  decoder_sparse_step and DeepSeek's moe_layer_freq where they map onto `Arch.moe_every`.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.specs.model.families import llama
from shardsim.specs.model.families.llama import llama_fields
from shardsim.specs.model.hf_keys import HFKeys
from shardsim.specs.model.spec import HFMapper


def _mixtral(k: HFKeys) -> dict[str, Any]:
    """Mixtral: num_local_experts experts of intermediate_size, num_experts_per_tok a token."""
    return llama_fields(k) | dict(experts=k.int("num_local_experts"), top_k=k.int("num_experts_per_tok"))


def _olmoe(k: HFKeys) -> dict[str, Any]:
    """OLMoE: num_experts experts of intermediate_size, q/k norms."""
    return llama_fields(k, qk_norm=True) | dict(experts=k.int("num_experts"), top_k=k.int("num_experts_per_tok"))


def _sparse_layers(k: HFKeys) -> dict[str, int]:
    """Qwen's dense layers: those in mlp_only_layers (where they lead: layers 0..n-1) and those
    decoder_sparse_step skips (layer i is MoE where (i + 1) % step == 0)."""
    step = k.int("decoder_sparse_step", default=1)
    if step < 1:
        raise ConfigError(
            f"expected an integer >= 1, got {step}", where=k.where, field=k.prefix + "decoder_sparse_step"
        )
    dense = k.get("mlp_only_layers") or []
    if not isinstance(dense, list) or dense != list(range(len(dense))) or (dense and step != 1):
        why = "only a leading run of dense layers (0, 1, ..., n-1) with decoder_sparse_step 1 is modelled"
        raise ConfigError(why, where=k.where, field=k.prefix + "mlp_only_layers")
    return dict(dense_layers=len(dense) or step - 1, moe_every=step)


def _qwen_moe(k: HFKeys, *, shared: bool, qkv_bias: bool = False, qk_norm: bool = False) -> dict[str, Any]:
    """Qwen2-MoE / Qwen3-MoE: num_experts experts of moe_intermediate_size; Qwen2-MoE's shared
    expert of shared_expert_intermediate_size, its output gated by a sigmoid."""
    out = llama_fields(k, qkv_bias=qkv_bias, qk_norm=qk_norm) | _sparse_layers(k)
    out |= dict(
        experts=k.int("num_experts"),
        top_k=k.int("num_experts_per_tok"),
        expert_ffn=k.int("moe_intermediate_size"),
    )
    if shared:
        out["shared_ffn"] = k.int("shared_expert_intermediate_size", default=0)
        out["shared_gate"] = out["shared_ffn"] > 0
    return out


def _deepseek_v3(k: HFKeys) -> dict[str, Any]:
    """DeepSeek-V3: latent attention, n_routed_experts experts of moe_intermediate_size beside
    n_shared_experts shared ones, the first first_k_dense_replace layers dense (intermediate_size),
    then every moe_layer_freq-th layer (counted from layer 0) MoE."""
    first = k.int("first_k_dense_replace", default=0)
    freq = k.int("moe_layer_freq", default=1)
    if freq < 1 or first % freq:
        why = f"MoE layers every {freq} from layer 0 after {first} dense ones are not modelled (freq must divide it)"
        raise ConfigError(why, where=k.where, field=k.prefix + "moe_layer_freq")
    expert_ffn = k.int("moe_intermediate_size")
    heads = k.int("num_attention_heads")
    kv = k.int("num_key_value_heads", default=heads)
    if kv != heads:
        why = f"latent attention has a key and a value per head: expected {heads}, got {kv}"
        raise ConfigError(why, where=k.where, field=k.prefix + "num_key_value_heads")
    for name in ("attention_bias", "mlp_bias"):
        if k.flag(name, False):
            raise ConfigError("biases are not modelled for the moe family", where=k.where, field=k.prefix + name)
    return dict(
        hidden=k.int("hidden_size"),
        layers=k.int("num_hidden_layers"),
        heads=heads,
        ffn=k.int("intermediate_size"),
        vocab=k.int("vocab_size"),
        seq_len=k.seq_len("max_position_embeddings"),
        tied_embeddings=k.flag("tie_word_embeddings", False),
        head_size=k.int("qk_nope_head_dim"),
        experts=k.int("n_routed_experts"),
        top_k=k.int("num_experts_per_tok"),
        expert_ffn=expert_ffn,
        shared_ffn=k.int("n_shared_experts", default=0) * expert_ffn,
        dense_layers=first,
        moe_every=freq,
        kv_lora_rank=k.int("kv_lora_rank"),
        q_lora_rank=k.int("q_lora_rank", default=0),
        rope_head_size=k.int("qk_rope_head_dim"),
        v_head_size=k.int("v_head_dim"),
    )


HF_TYPES: dict[str, HFMapper] = {
    "mixtral": _mixtral,
    "qwen2_moe": partial(_qwen_moe, shared=True, qkv_bias=True),
    "qwen3_moe": partial(_qwen_moe, shared=False, qk_norm=True),
    "olmoe": _olmoe,
    "deepseek_v3": _deepseek_v3,
}

# llama's layers, traits and tensor-parallel plan, with mixture-of-experts MLPs
SPEC = replace(llama.SPEC, name="moe", hf_types=HF_TYPES, moe=True)
