"""Torch models built from a workload's `Arch`, in the block structure the simulator costs.

Every model has ``embed`` (or None), ``blocks`` (an nn.ModuleList: the units FSDP wraps
and pipelines split) and ``head``; ``forward`` chains them; ``loss`` is cross-entropy;
``sample_batch`` makes seeded synthetic data (as the seed's FakeDataset).

One transformer layer serves every family, as its `Traits` say: the norm (LayerNorm, LayerNorm
without bias, RMSNorm), biases or none (or on q, k and v alone), a GELU or a SwiGLU MLP, learned
or rotary positions, grouped-query attention through `F.scaled_dot_product_attention`
(``enable_gqa``) or Hugging Face's eager attention (`eager_attention`), an explicit head width,
q/k norms. `runtime.models.builders` assembles a
family's model from these modules.
Simplifications, named: q, k and v come from one fused projection (its output is what
attention saves), its rows in ``qkv_groups`` groups [q_g, k_g, v_g] (one per tensor-parallel rank, so
that a contiguous row shard holds a rank's query heads and their key/value heads; one group is
plain [q, k, v]); rotary embeddings rotate the whole head dimension (GPT-NeoX rotates a
quarter: no parameters, no matmul FLOPs either way); MPT's ALiBi bias is not applied (no
position parameters, and the attention runs as a plain causal kernel); GPT-NeoX's parallel
residual runs sequentially (same parameters and FLOPs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shardsim.specs.model.arch import Arch


def norm(kind: str, hidden: int) -> nn.Module:
    if kind == "rmsnorm":
        return nn.RMSNorm(hidden)
    return nn.LayerNorm(hidden, bias=kind == "layernorm")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x (batch, heads, seq, head_dim), rotate-half form, computed in
    float32 and returned in x's dtype, as torchtitan's CosSinRoPE.apply_rotary_emb: the tables are
    float32 buffers, which FSDP2's MixedPrecisionPolicy leaves uncast while q, k and v arrive in
    its param_dtype (in fp32 the casts are no-ops)."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).type_as(x)


def rope_tables(seq: int, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Attention of q (batch, heads, seq, head_dim) over k and v without SDPA, as Hugging Face
    Transformers' ``eager_attention_forward`` runs it: grouped key/value heads repeated to the
    query heads, the scores' matmul times the scale, an additive causal mask (the dtype's lowest
    value above the diagonal), the softmax in float32 cast back to q's dtype, the matmul with v
    (no dropout: the families have none)."""
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if causal:
        s = q.shape[-2]
        low = torch.finfo(scores.dtype).min
        scores = scores + torch.full((s, s), low, dtype=scores.dtype, device=scores.device).triu(1)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


class Attention(nn.Module):
    """Self-attention with a fused qkv projection whose rows are `groups` blocks [q_g, k_g, v_g]
    (and an RMSNorm over each head's q and k where the model has them: `Arch.qk_norm`).

    ``forward`` reads its head counts from the width of the qkv output it gets: the whole
    projection (every group) or a tensor-parallel rank's row shard (its own groups)."""

    def __init__(self, a: Arch, groups: int = 1):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = a.heads, a.kv, a.head_dim
        self.q_width, self.kv_width = a.q_dim // groups, a.kv_dim // groups  # per group
        self.causal = a.traits.causal
        bias = a.traits.bias
        self.qkv = nn.Linear(a.hidden, a.q_dim + 2 * a.kv_dim, bias=bias or a.qkv_bias)
        self.proj = nn.Linear(a.q_dim, a.hidden, bias=bias)
        self.q_norm = nn.RMSNorm(a.head_dim) if a.qk_norm else None
        self.k_norm = nn.RMSNorm(a.head_dim) if a.qk_norm else None
        self.backends: list | None = None  # SDPBackends to restrict SDPA to (`runtime.stack`); None: PyTorch's choice
        self.eager = False  # `eager_attention` in place of SDPA (`runtime.stack`)
        self.rope = a.position_kind == "rope"
        if self.rope:
            cos, sin = rope_tables(a.tokens, a.head_dim)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(x)
        qw, kvw, hd = self.q_width, self.kv_width, self.head_dim
        g = qkv.shape[-1] // (qw + 2 * kvw)  # groups held here (all, or a TP rank's)
        q, k, v = qkv.view(b, s, g, qw + 2 * kvw).split([qw, kvw, kvw], dim=-1)
        q, k = q.reshape(b, s, -1, hd), k.reshape(b, s, -1, hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.reshape(b, s, -1, hd).transpose(1, 2)
        if self.rope:
            q, k = rotate(q, self.cos[:s], self.sin[:s]), rotate(k, self.cos[:s], self.sin[:s])
        gqa = k.shape[1] != q.shape[1]
        if self.eager:
            y = eager_attention(q, k, v, self.causal)
        elif self.backends is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=gqa)
        else:
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel(self.backends):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=gqa)
        return self.proj(y.transpose(1, 2).reshape(b, s, q.shape[1] * hd))


class GeluMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int, bias: bool):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn, bias=bias)
        self.fc2 = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), three matrices (Llama's w1, w3, w2)."""

    def __init__(self, hidden: int, ffn: int, bias: bool):
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=bias)
        self.up = nn.Linear(hidden, ffn, bias=bias)
        self.down = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class TransformerLayer(nn.Module):
    """Pre-norm transformer layer: x + attn(norm1(x)), then x + mlp(norm2(x)); `mlp` in place of
    the family's dense MLP where given (a mixture of experts)."""

    def __init__(self, a: Arch, qkv_groups: int = 1, mlp: nn.Module | None = None):
        super().__init__()
        t = a.traits
        self.tp_plan = a.spec.tp_plan  # the module names tensor parallelism splits
        self.ln1 = norm(t.norm, a.hidden)
        self.attn = Attention(a, qkv_groups)
        self.ln2 = norm(t.norm, a.hidden)
        dense = SwiGLU if t.mlp == "swiglu" else GeluMLP
        self.mlp = mlp if mlp is not None else dense(a.hidden, a.ffn_size, t.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class MLPBlock(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))


class TokenEmbed(nn.Module):
    def __init__(self, vocab: int, seq: int, hidden: int, learned_positions: bool):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.zeros(seq, hidden)) if learned_positions else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        if self.pos is None:
            return x
        pos = self.pos
        if hasattr(pos, "to_local"):  # tensor parallel: a DTensor, sharded along the sequence under SP
            pos = pos.to_local()
        return x + pos


class PatchEmbed(nn.Module):
    def __init__(self, a: Arch):
        super().__init__()
        self.conv = nn.Conv2d(a.channels, a.hidden, kernel_size=a.patch, stride=a.patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, a.hidden))
        self.pos = nn.Parameter(torch.zeros(a.tokens, a.hidden))

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.conv(img).flatten(2).transpose(1, 2)
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos


def masked_positions(seq: int, k: int, device: torch.device | None = None) -> torch.Tensor:
    """The `k` positions of a sequence of `seq` tokens a masked-LM head predicts: evenly spaced
    (the same every step; a named simplification of BERT's random draw, at the same cost)."""
    return torch.arange(k, device=device) * seq // k


class LMHead(nn.Module):
    """Final norm and the LM head; with `masked` = k > 0 (a masked-LM head) on k positions of
    each sequence only (`masked_positions`), gathered before the norm."""

    def __init__(self, hidden: int, vocab: int, norm_kind: str):
        super().__init__()
        self.norm = norm(norm_kind, hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)
        self.masked = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.masked:
            x = x[:, masked_positions(x.shape[1], self.masked, x.device)]
        return self.out(self.norm(x))


class ClsHead(nn.Module):
    def __init__(self, hidden: int, classes: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x)[:, 0])


class ShardsimModel(nn.Module):
    """embed → blocks → head, the structure shared with the simulator."""

    def __init__(self, arch: Arch, embed: nn.Module | None, blocks: list[nn.Module], head: nn.Module):
        super().__init__()
        self.arch = arch
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy; a masked-LM head's output (fewer positions than the targets) against
        the targets of its positions."""
        if output.dim() == 3 and target.dim() == 2 and output.shape[1] != target.shape[1]:
            target = target[:, masked_positions(target.shape[1], output.shape[1], target.device)]
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def sample_batch(self, batch: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return sample_batch(self.arch, batch, generator)


def sample_batch(a: Arch, batch: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic inputs and targets for `batch` samples (seeded through `generator`)."""
    g = generator
    if a.traits.tokens == "text":
        ids = torch.randint(0, a.vocab, (batch, a.seq_len), generator=g)
        return ids, torch.randint(0, a.vocab, (batch, a.seq_len), generator=g)
    if a.traits.tokens == "image":
        img = torch.randn(batch, a.channels, a.image, a.image, generator=g)
        return img, torch.randint(0, a.classes, (batch,), generator=g)
    x = torch.randn(batch, a.hidden, generator=g)
    return x, torch.randint(0, a.classes, (batch,), generator=g)


class _MLPHead(nn.Module):
    def __init__(self, hidden: int, classes: int):
        super().__init__()
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x)


def build_text(a: Arch, qkv_groups: int = 1, mlps: list[nn.Module | None] | None = None) -> ShardsimModel:
    """A text model: token embedding (learned positions where it has them), transformer layers, LM
    head; `mlps[i]` (where not None) in place of layer i's dense MLP."""
    mlps = mlps or [None] * a.layers
    blocks = [TransformerLayer(a, qkv_groups, mlp) for mlp in mlps]
    embed = TokenEmbed(a.vocab, a.seq_len, a.hidden, a.position_kind == "learned")
    head = LMHead(a.hidden, a.vocab, a.traits.norm)
    if a.tied_embeddings:
        nn.init.normal_(embed.tok.weight, std=0.02)  # it is the output projection too (GPT-2's init)
        head.out.weight = embed.tok.weight
    return ShardsimModel(a, embed, blocks, head)


def build_vit(a: Arch, qkv_groups: int = 1) -> ShardsimModel:
    """A Vision Transformer: patch embedding, transformer layers, classifier on [CLS]."""
    blocks = [TransformerLayer(a, qkv_groups) for _ in range(a.layers)]
    return ShardsimModel(a, PatchEmbed(a), blocks, ClsHead(a.hidden, a.classes))


def build_mlp(a: Arch, qkv_groups: int = 1) -> ShardsimModel:
    """A stack of MLP blocks and a classifier (no attention: `qkv_groups` does not apply)."""
    blocks = [MLPBlock(a.hidden, a.ffn_size) for _ in range(a.layers)]
    return ShardsimModel(a, None, blocks, _MLPHead(a.hidden, a.classes))
