"""The runtime's models of every family train on the CPU, a rotary model runs under FSDP2's bf16
mixed precision, and grouped-query attention through ``enable_gqa`` equals attention over repeated
key/value heads."""

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


@pytest.mark.parametrize("workload", [FAMILIES["llama"], "tiny-moe"], ids=["llama", "tiny-moe"])
def test_a_rotary_model_runs_in_bf16_under_fsdp2s_mixed_precision(workload) -> None:
    """FSDP2's MixedPrecisionPolicy casts the parameters to bf16 and leaves the buffers (the float32
    rotary tables) as they are: the rotated q and k come back in bf16 beside v, and a forward and
    backward on one rank of the fake process group give the fp32 loss to bf16's precision."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardsim.runtime.strategies.fsdp import apply_fsdp

    model = build(workload, seed=0)
    x, y = model.sample_batch(2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        fp32 = model.loss(model(x), y).item()
    dist.init_process_group("fake", rank=0, world_size=1, store=FakeStore())
    try:
        apply_fsdp(model, init_device_mesh("cpu", (1,)), mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
        out = model(x)
        assert out.dtype == torch.bfloat16
        loss = model.loss(out, y)
        loss.backward()
    finally:
        dist.destroy_process_group()
    assert loss.item() == pytest.approx(fp32, rel=2e-2)
    assert all(p.grad is not None and torch.isfinite(p.grad.full_tensor()).all() for p in model.parameters())


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
