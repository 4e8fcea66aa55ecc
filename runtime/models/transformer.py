"""Torch models built from a workload's `Arch`, in the block structure the simulator costs.

Every model has ``embed`` (or None), ``blocks`` (an nn.ModuleList: the units FSDP wraps
and pipelines split) and ``head``; ``forward`` chains them; ``loss`` is cross-entropy;
``sample_batch`` makes seeded synthetic data (as the seed's FakeDataset).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shardsim.simulator.workload.model import Arch


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, causal: bool):
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class TransformerLayer(nn.Module):
    """Pre-LN transformer layer: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, hidden: int, heads: int, ffn: int, causal: bool):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, causal)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class MLPBlock(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))


class TokenEmbed(nn.Module):
    def __init__(self, vocab: int, seq: int, hidden: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.zeros(seq, hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos


class PatchEmbed(nn.Module):
    def __init__(self, a: Arch):
        super().__init__()
        self.conv = nn.Conv2d(a.channels, a.hidden, kernel_size=a.patch, stride=a.patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, a.hidden))
        self.pos = nn.Parameter(torch.zeros(a.tokens, a.hidden))

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.conv(img).flatten(2).transpose(1, 2)
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos


class LMHead(nn.Module):
    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def sample_batch(self, batch: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return sample_batch(self.arch, batch, generator)


def sample_batch(a: Arch, batch: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic inputs and targets for `batch` samples (seeded through `generator`)."""
    g = generator
    if a.family in ("gpt", "bert"):
        ids = torch.randint(0, a.vocab, (batch, a.seq_len), generator=g)
        return ids, torch.randint(0, a.vocab, (batch, a.seq_len), generator=g)
    if a.family == "vit":
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


def build_model(a: Arch) -> ShardsimModel:
    """The torch model of an architecture (build under `torch.device('meta')` to cost it free)."""
    if a.family == "mlp":
        blocks = [MLPBlock(a.hidden, a.ffn_size) for _ in range(a.layers)]
        return ShardsimModel(a, None, blocks, _MLPHead(a.hidden, a.classes))
    causal = a.family == "gpt"
    blocks = [TransformerLayer(a.hidden, a.heads, a.ffn_size, causal) for _ in range(a.layers)]
    if a.family == "vit":
        return ShardsimModel(a, PatchEmbed(a), blocks, ClsHead(a.hidden, a.classes))
    return ShardsimModel(a, TokenEmbed(a.vocab, a.seq_len, a.hidden), blocks, LMHead(a.hidden, a.vocab))
