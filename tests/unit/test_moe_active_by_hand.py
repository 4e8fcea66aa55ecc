"""The active parameter counts of the MoE library models are their architectures' exact counts,
tensor by tensor as the Hugging Face checkpoints hold them (summed here by hand from config.json's
fields), so that where a count differs from a model card's figure, the card's rounding is what
differs. DeepSeek-V3 publishes two figures for its main model's active parameters: 37 B (the
technical report, arXiv 2412.19437) and 36.7 B "including 0.9B for Embedding and 0.9B for the
output Head" (README_WEIGHTS.md of deepseek-ai/DeepSeek-V3); the tensors of its config.json sum to
37.55 B with both. Qwen3-30B-A3B's card says 3.3 B activated; its tensors sum to 3.353 B."""

from __future__ import annotations

from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.library import PRESETS


def _swiglu(hidden: int, ffn: int) -> int:
    return 3 * hidden * ffn  # gate, up and down projections, no biases


def test_deepseek_v3_active_is_its_tensors_summed():
    h, layers, dense, vocab = 7168, 61, 3, 129280
    heads, nope, rope, v, q_rank, kv_rank = 128, 128, 64, 128, 1536, 512
    attention = (
        h * q_rank + q_rank  # q_a_proj, q_a_layernorm
        + q_rank * heads * (nope + rope)  # q_b_proj
        + h * (kv_rank + rope) + kv_rank  # kv_a_proj_with_mqa, kv_a_layernorm
        + kv_rank * heads * (nope + v)  # kv_b_proj
        + heads * v * h  # o_proj
    )  # fmt: skip
    norms = 2 * h  # input_layernorm, post_attention_layernorm
    dense_ffn = _swiglu(h, 18432)
    moe_active = (8 + 1) * _swiglu(h, 2048) + 256 * h  # top-8 routed + 1 shared expert, the router
    active = (
        layers * (attention + norms)
        + dense * dense_ffn
        + (layers - dense) * moe_active
        + 2 * vocab * h  # embed_tokens, lm_head (untied)
        + h  # the final norm
    )
    w = from_arch("deepseek-v3", PRESETS["deepseek-v3"])
    assert abs(w.active_params - active) <= 1e-6 * active, (w.active_params, active)
    assert round(active / 1e9, 2) == 37.55


def test_qwen3_30b_a3b_active_is_its_tensors_summed():
    h, layers, vocab, heads, kv, d = 2048, 48, 151936, 32, 4, 128
    attention = h * heads * d + 2 * h * kv * d + heads * d * h + 2 * d  # q, k, v, o; q_norm, k_norm
    moe_active = 8 * _swiglu(h, 768) + 128 * h  # top-8 of 128 experts, the router
    active = layers * (attention + 2 * h + moe_active) + 2 * vocab * h + h
    w = from_arch("qwen3-30b-a3b", PRESETS["qwen3-30b-a3b"])
    assert abs(w.active_params - active) <= 1e-6 * active, (w.active_params, active)
    assert round(active / 1e9, 3) == 3.353
