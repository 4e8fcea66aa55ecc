"""The runtime's models of every family train on the CPU, and grouped-query attention through
``enable_gqa`` equals attention over repeated key/value heads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shardsim.runtime.models.build import build
from shardsim.runtime.models.transformer import Attention
from shardsim.specs.model.arch import Arch, Shape

FAMILIES = {
    "llama": Arch("llama", hidden=64, layers=2, heads=4, kv_heads=2, ffn=96, seq_len=16, vocab=128),
    "mpt": Arch("mpt", hidden=64, layers=2, heads=4, seq_len=16, vocab=128, tied_embeddings=True),
    "gpt-rope": Arch("gpt", hidden=64, layers=2, heads=4, seq_len=16, vocab=128, positions="rope"),
    "bert": Arch("bert", hidden=64, layers=2, heads=4, seq_len=16, vocab=128, tied_embeddings=True),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_trains_on_the_cpu(name: str) -> None:
    model = build(FAMILIES[name], seed=0)
    x, y = model.sample_batch(2, torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = model.loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    if FAMILIES[name].tied_embeddings:
        assert model.head.out.weight is model.embed.tok.weight


def test_shape_flags_reach_the_runtime() -> None:
    model = build("tiny-gpt", seed=0, shape=Shape(layers=2, seq_len=8))
    assert len(model.blocks) == 2 and model.embed.pos.shape[0] == 8


def test_grouped_query_attention_equals_repeated_heads() -> None:
    torch.manual_seed(0)
    a = FAMILIES["llama"]
    attn = Attention(a)
    x = torch.randn(2, a.seq_len, a.hidden)
    got = attn(x)
    b, s, h = x.shape
    q, k, v = attn.qkv(x).split([h, a.kv_dim, a.kv_dim], dim=-1)
    q, k, v = (t.view(b, s, -1, a.head_dim).transpose(1, 2) for t in (q, k, v))
    q, k = (t * attn.cos + torch.cat((-t.chunk(2, -1)[1], t.chunk(2, -1)[0]), -1) * attn.sin for t in (q, k))
    rep = a.heads // a.kv
    y = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
    assert torch.allclose(got, attn.proj(y.transpose(1, 2).reshape(b, s, h)), atol=1e-5)
