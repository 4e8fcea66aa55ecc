"""Mixture-of-experts models: the library's and Hugging Face's parameter counts (total and
active), the MoE layer's and latent attention's figures against a hand count, what is refused,
and what load imbalance and a capacity factor do to a step."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.cli import main
from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError
from shardsim.simulator import gpu_kernels as gk
from shardsim.simulator.predict import predict
from shardsim.specs.hardware.topology import load_instance
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.describe import arch_from_mapping
from shardsim.specs.model.hf_config import read_hf_config
from shardsim.specs.model.library import PRESETS, library

HF = Path(__file__).parents[1] / "fixtures" / "hf"
MOE_MODELS = ("mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b", "olmoe-1b-7b")
# the library model each config.json fixture is (read at the library's sequence length)
FIXTURES = {
    "Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "DeepSeek-V3": "deepseek-v3",
    "Qwen3-30B-A3B": "qwen3-30b-a3b",
    "OLMoE-1B-7B-0924": "olmoe-1b-7b",
}
H100 = load_instance("p5.48xlarge").device


def _unit(published: float) -> float:
    """One unit of a published count's last significant digit (37e9 → 1e9, 12.9e9 → 1e8)."""
    digits = str(int(published)).rstrip("0")
    return 10.0 ** (len(str(int(published))) - len(digits))


@pytest.mark.parametrize("name", MOE_MODELS)
def test_total_and_active_counts_are_the_published_ones(name):
    # totals within 0.5 %; the active counts as precisely as the cards publish them (two
    # significant figures for all but Mixtral 8x7B: 37 B, 3.3 B, 1.3 B), and within 0.5 % beside
    m = library()[name]
    w = from_arch(name, m.arch)
    assert m.published_params and m.published_active
    assert abs(w.params / m.published_params - 1) <= 0.005, (name, w.params)
    tolerance = max(0.005 * m.published_active, _unit(m.published_active))
    assert abs(w.active_params - m.published_active) <= tolerance, (name, w.active_params)
    assert w.active_params < w.params


def test_the_mixtral_counts_hold_to_half_a_percent():
    for name in ("mixtral-8x7b", "mixtral-8x22b"):
        m, w = library()[name], from_arch(name, library()[name].arch)
        assert m.published_active is not None
        assert abs(w.active_params / m.published_active - 1) <= 0.005, (name, w.active_params)


@pytest.mark.parametrize(("folder", "name"), FIXTURES.items())
def test_a_config_json_reads_as_the_library_model(folder, name):
    arch = read_hf_config(HF / folder / "config.json")
    assert replace(arch, seq_len=PRESETS[name].seq_len) == PRESETS[name]


def test_qwen2_moe_has_biases_and_a_gated_shared_expert():
    # Qwen1.5-MoE-A2.7B: 14.3 B parameters, 2.7 B activated (its model card)
    a = read_hf_config(HF / "Qwen1.5-MoE-A2.7B" / "config.json")
    assert a.qkv_bias and a.shared_gate and a.shared_ffn == 5632 and a.expert_ffn == 1408
    w = from_arch("qwen2_moe", a)
    assert abs(w.params / 14.3e9 - 1) <= 0.005 and abs(w.active_params / 2.7e9 - 1) <= 0.005


def test_tiny_moe_layer_against_a_hand_count():
    # tiny-moe: hidden 64, 4 heads, 32 tokens, 4 experts of ffn 64, top-2; layer 0 dense (ffn 256)
    w = from_arch("tiny-moe", PRESETS["tiny-moe"])
    dense, moe = w.layers[0], w.layers[1]
    assert dense.moe is None and moe.moe is not None
    attention = 4 * 64 * 64  # q, k, v, o
    router, expert = 64 * 4, 3 * 64 * 64  # hidden x experts; w1, w3, w2
    norms = 2 * 64
    assert moe.params == attention + router + 4 * expert + norms
    assert moe.active_params == attention + router + 2 * expert + norms
    causal_attention = 4 * 32 * 32 * 64 / 2  # QK^T and PV over heads x head width, half of them
    assert moe.fwd_flops == 2 * 32 * (attention + router + 2 * expert) + causal_attention
    assert moe.bwd_flops == 2 * 2 * 32 * (attention + router + 2 * expert) + 2.5 * causal_attention
    # model FLOPs count the active parameters: the MoE layer computes less than the dense one
    assert moe.fwd_flops < dense.fwd_flops
    # saved for backward beyond the attention's and the norms': router probabilities, top-k indices;
    # per row its sort position, token index and gate value; the permuted tokens and the experts'
    # output (64 rows x hidden each); SwiGLU's four
    rows = 32 * 2
    moe_saved = 32 * 4 + 4 * rows + rows * 2 * 64 + rows * 4 * 64
    dense_saved = 32 * 4 * 256
    assert moe.act_elems - dense.act_elems == moe_saved - dense_saved
    assert moe.moe.mean_rows == 16 and moe.moe.busiest_rows(2.0) == 32


def test_latent_attention_against_a_hand_count():
    a = PRESETS["deepseek-v3"]
    w = from_arch("deepseek-v3", a)
    dense = w.layers[0]  # first_k_dense_replace: layers 0-2 dense
    h, heads = 7168, 128
    mla = 7168 * 1536 + 1536 * heads * 192 + 7168 * (512 + 64) + 512 * heads * (128 + 128) + heads * 128 * h
    assert dense.params == mla + 1536 + 512 + 3 * h * 18432 + 2 * h
    s = 4096
    attention = 2.0 * s * s * heads * (192 + 128) / 2  # QK^T over 192 wide, PV over 128, causal
    assert dense.fwd_flops == 2.0 * s * (mla + 3 * h * 18432) + attention
    assert [i for i in range(a.layers) if a.is_moe_layer(i)] == list(range(3, 61))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"v_head_size": 128}, "v_head_size"),  # latent-attention fields without kv_lora_rank
        ({"kv_lora_rank": 32}, "rope_head_size"),
        ({"kv_lora_rank": 32, "rope_head_size": 3, "v_head_size": 16}, "rope_head_size"),
        ({"kv_lora_rank": 32, "rope_head_size": 8, "v_head_size": 16, "kv_heads": 2}, "kv_heads"),
        ({"shared_gate": True}, "shared_gate"),
        ({"q_lora_rank": -1}, "q_lora_rank"),
    ],
)
def test_inconsistent_latent_attention_and_shared_expert_fields_are_refused_by_name(change, field):
    base = {"family": "moe", "hidden": 64, "layers": 2, "heads": 4, "vocab": 8, "seq_len": 8, "experts": 4, "top_k": 2}
    with pytest.raises(ConfigError) as err:
        arch_from_mapping(base | change, "m.yaml")
    assert err.value.field == field and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("folder", "old", "new", "key"),
    [
        ("Qwen3-30B-A3B", '"mlp_only_layers": []', '"mlp_only_layers": [3]', "mlp_only_layers"),
        ("Mixtral-8x7B-v0.1", '"num_experts_per_tok": 2', '"num_experts_per_tok": 9', "num_experts_per_tok"),
        ("DeepSeek-V3", '"qk_rope_head_dim": 64', '"qk_rope_head_dim": 0', "qk_rope_head_dim"),
        ("DeepSeek-V3", '"n_routed_experts": 256', '"n_routed_experts": 2000000', "n_routed_experts"),
    ],
)
def test_a_config_json_it_cannot_model_is_refused_by_the_files_key(tmp_path, folder, old, new, key):
    text = (HF / folder / "config.json").read_text()
    assert old in text
    (tmp_path / "config.json").write_text(text.replace(old, new))
    with pytest.raises(ConfigError) as err:
        read_hf_config(tmp_path / "config.json")
    assert err.value.field == key


def _cfg(**changes) -> RunConfig:
    base = dict(
        workload="mixtral-8x7b", topology="p5.48xlarge", nodes=2, strategy="zero", shape={"layers": 2, "seq_len": 4096}
    )
    return RunConfig(**(base | changes))


def test_imbalance_raises_the_step_time_monotonically():
    steps = [predict(_cfg(moe_imbalance=i)).step_time_s for i in (1.0, 1.5, 2.0, 3.0, 4.0)]
    assert steps == sorted(steps) and steps[-1] > steps[0]


def test_a_capacity_factor_drops_the_busiest_experts_excess():
    dropless = predict(_cfg(moe_imbalance=3.0)).moe
    capped = predict(_cfg(moe_imbalance=3.0, moe_capacity=1.25)).moe
    assert dropless is not None and capped is not None
    assert capped["tokens_per_expert_busiest"] == 1.25 * capped["tokens_per_expert_mean"]
    assert capped["grouped_gemm_s"] < dropless["grouped_gemm_s"]


def test_a_capacity_factor_caps_every_expert():
    moe = from_arch("tiny-moe", PRESETS["tiny-moe"]).layers[1].moe  # 32 tokens x top-2 over 4 experts
    assert moe is not None
    assert gk.routed_rows(moe, 1, 2.0) == (64, 32)  # dropless: the busiest 32 rows, the others 32 among 3
    assert gk.routed_rows(moe, 1, 2.0, 1.25) == (20 + 3 * (32 / 3), 20)  # the busiest capped at 1.25 x 16
    assert gk.routed_rows(moe, 1, 1.0, 0.5) == (4 * 8, 8)  # under the mean: every expert drops half


def test_the_prediction_names_the_moe_parts_and_counts_active_parameters():
    p = predict(_cfg())
    assert p.moe is not None and p.active_params is not None
    assert {"router_s", "permute_s", "grouped_gemm_s", "shared_expert_s"} <= set(p.moe)
    assert all(p.moe[k] > 0 for k in ("router_s", "permute_s", "grouped_gemm_s"))
    assert p.active_params < p.params and "N_active" in p.mfu_formula
    assert "moe" in p.to_dict() and "moe" not in predict(RunConfig(workload="tiny-gpt", nodes=1)).to_dict()
    # every rank holds its FSDP shard of every expert (expert parallelism 1): fp32 parameters over 16 ranks
    assert p.memory["params_gib"] * 2**30 == pytest.approx(p.params * 4 / 16, rel=1e-3)


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--workload", "mixtral-8x7b", "--moe-imbalance", "5"], "moe_imbalance"),  # 8 experts, top-2: at most 4
        (["--workload", "tiny-gpt", "--moe-capacity", "1.25"], "moe_capacity"),  # no experts
        (["--workload", "deepseek-v3", "--tp", "8"], "tp"),  # latent attention under tp
    ],
)
def test_moe_settings_it_cannot_apply_are_one_line_exit_2(capsys, argv, field):
    assert main(["predict", "--topology", "p5.48xlarge", "--nodes", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    groups=st.integers(2, 256),
    mean=st.floats(1.0, 4096.0),
    n=st.sampled_from([64, 768, 2048, 14336]),
    k=st.sampled_from([64, 2048, 4096, 7168]),
    low=st.floats(1.0, 8.0),
    more=st.floats(0.0, 8.0),
)
def test_a_busier_expert_never_makes_a_grouped_gemm_faster(groups, mean, n, k, low, more):
    high = min(low + more, float(groups))
    spec, rate, bw = H100.kernels, 795e12, 2.85e12
    assert spec is not None
    for inner in (False, True):
        times = [
            gk.grouped_gemm_time(gk.GroupedGemm(groups, groups * mean, b * mean, n, k, inner), spec, rate, bw, 2)
            for b in (min(low, groups), high)
        ]
        assert times[1] >= times[0] * (1 - 1e-12) and math.isfinite(times[1])


def test_workloads_says_total_and_active_parameters(capsys):
    assert main(["workloads", "--json"]) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    mixtral, llama = rows["mixtral-8x7b"], rows["llama-3.1-8b"]
    assert mixtral["active_params"] < mixtral["params"] and mixtral["published_active_params"] == 12.9e9
    assert mixtral["active_source"] and "active_params" not in llama
    assert main(["workloads", str(HF / "Mixtral-8x7B-v0.1" / "config.json")]) == 0
    assert "12.88 B parameters a token (8 experts of ffn 14336, 2 a token" in capsys.readouterr().out
