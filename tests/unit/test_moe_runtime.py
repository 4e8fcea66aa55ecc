"""The runtime's moe family: its MoE layer computes what a plain loop over tokens and their experts
computes, its parameters are those the specs count (router, experts, shared expert, attention;
dense layers dense), and it counts the tokens each expert is routed."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.checkpoint import checkpoint

from shardsim.runtime.models.builders import build_model
from shardsim.runtime.models.moe import MoE, _expert_major, moe_layers
from shardsim.runtime.models.transformer import SwiGLU
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.library import PRESETS

TINY = PRESETS["tiny-moe"]


def naive(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: the softmax gate's top k experts, each a SwiGLU of its own weights."""
    e = moe.experts
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        probs = F.softmax(moe.router.gate(x[t]), dim=-1)
        top, ids = torch.topk(probs, moe.router.top_k)
        for gate, i in zip(top, ids.tolist(), strict=True):
            out[t] += gate * ((F.silu(x[t] @ e.w1[i]) * (x[t] @ e.w3[i])) @ e.w2[i])
        if moe.shared is not None:
            gate = torch.sigmoid(moe.shared_gate(x[t])) if moe.shared_gate is not None else 1.0
            out[t] += gate * moe.shared(x[t])
    return out


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    experts=st.integers(1, 6),
    top_k=st.integers(1, 3),
    shared=st.sampled_from([0, 24]),
    gated=st.booleans(),
    tokens=st.integers(1, 8),
)
def test_the_moe_layer_equals_a_loop_over_tokens_and_their_experts(experts, top_k, shared, gated, tokens) -> None:
    assume(top_k <= experts)
    assume(shared or not gated)
    torch.manual_seed(experts * 100 + tokens)
    moe = MoE(16, experts, top_k, 8, shared, shared_gate=gated)
    assert (moe.shared_gate is not None) == gated
    x = torch.randn(1, tokens, 16)
    torch.testing.assert_close(moe(x)[0], naive(moe, x[0]), rtol=1e-5, atol=1e-6)
    assert int(moe.tokens_per_expert.sum()) == tokens * top_k


def test_its_parameters_are_those_the_specs_count() -> None:
    """tiny-moe (4 layers, the first dense) and a variant with a shared expert and every other
    layer MoE, and one with a gated shared expert: llama's count of the same shape, each MoE layer's
    dense MLP replaced by the router (hidden x experts), the experts (3 x hidden x expert_ffn each),
    the shared expert (3 x hidden x shared_ffn) and its gate (hidden)."""
    for a in (
        TINY,
        replace(TINY, shared_ffn=32, dense_layers=0, moe_every=2),
        replace(TINY, shared_ffn=32, shared_gate=True),
    ):
        with torch.device("meta"):
            model = build_model(a)
        dense = from_arch("dense", Arch("llama", **{k: getattr(a, k) for k in ("hidden", "layers", "heads", "ffn",
                                                                             "seq_len", "vocab")})).params  # fmt: skip
        per_moe = a.hidden * a.experts + 3 * a.experts * a.hidden * a.expert_ffn_size + 3 * a.hidden * a.shared_ffn
        per_moe += a.hidden if a.shared_gate else 0  # the shared expert's gate: Linear(hidden, 1, bias=False)
        want = dense + a.moe_layers * (per_moe - 3 * a.hidden * a.ffn_size)
        assert sum(p.numel() for p in model.parameters()) == want
        kinds = [type(b.mlp) for b in model.blocks]
        assert kinds == [MoE if a.is_moe_layer(i) else SwiGLU for i in range(a.layers)]


def test_a_recomputation_is_not_counted_again() -> None:
    torch.manual_seed(0)
    moe = MoE(16, 4, 2, 8, 0)
    x = torch.randn(2, 5, 16, requires_grad=True)
    checkpoint(moe, x, use_reentrant=False).sum().backward()
    assert int(moe.tokens_per_expert.sum()) == 2 * 5 * 2


def test_the_model_lists_its_moe_layers_by_index() -> None:
    model = build_model(replace(TINY, layers=6, dense_layers=1, moe_every=2))
    assert [m.layer for m in moe_layers(model)] == [1, 3, 5]


def test_rank_major_blocks_reorder_expert_major() -> None:
    counts = torch.tensor([[1, 2], [0, 3]])  # [source rank][local expert]: rows r0e0, r0e1 x2, r1e1 x3
    assert _expert_major(counts).tolist() == [0, 1, 2, 3, 4, 5]
    counts = torch.tensor([[2, 1], [1, 0]])  # r0e0 x2, r0e1, r1e0 → e0: r0 r0 r1, e1: r0
    assert _expert_major(counts).tolist() == [0, 1, 3, 2]


def test_a_runs_summary_says_each_moe_layers_imbalance() -> None:
    from shardsim.runtime.train import _summary_text
    from tests.helpers import run_record

    assert "experts" not in _summary_text(run_record(), None)
    text = _summary_text(run_record(expert_imbalance=[1.104, 1.25]), None)
    assert "  experts     busiest over mean 1.10, 1.25 (each MoE layer)" in text
