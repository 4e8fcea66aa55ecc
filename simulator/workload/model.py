"""Workloads: a model as an ordered list of blocks (the units FSDP wraps and pipelines split).

Presets are described by an `Arch` and costed analytically here, without torch. A model
given by import path (``pkg.module:build_fn``) is measured on the meta device instead
(`simulator.measure`, which imports torch). Both produce the same `Workload`; a test checks
that the analytic numbers equal what torch measures on the runtime's own modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shardsim.simulator.errors import ConfigError

FAMILIES = ("gpt", "bert", "vit", "mlp")


@dataclass(frozen=True)
class Arch:
    """Shape of a preset model; `runtime.models.build_model` builds exactly this in torch."""

    family: str  # gpt (causal decoder) | bert (encoder) | vit | mlp
    hidden: int
    layers: int
    heads: int = 1
    ffn: int = 0  # MLP inner size; 0 → 4 * hidden
    seq_len: int = 0  # tokens per sample (gpt/bert); derived for vit; 1 for mlp
    vocab: int = 0  # gpt/bert
    image: int = 224  # vit
    patch: int = 16  # vit
    channels: int = 3  # vit
    classes: int = 1000  # vit/mlp

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def tokens(self) -> int:
        if self.family == "vit":
            return (self.image // self.patch) ** 2 + 1  # patches + [CLS]
        if self.family == "mlp":
            return 1
        return self.seq_len


@dataclass(frozen=True)
class Block:
    """One unit of the model. All figures are per sample (one sequence / image)."""

    name: str
    params: int
    fwd_flops: float  # matmul FLOPs of forward (2 per multiply-add)
    bwd_flops: float  # matmul FLOPs of backward (input + weight gradients)
    fwd_mem_elems: float  # elements read+written by memory-bound forward ops (norms, GELU, adds)
    act_elems: float  # activation elements saved for backward without checkpointing
    in_elems: float  # elements of the block's input (saved alone under checkpointing)
    out_elems: float  # elements of the block's output (what a pipeline stage sends on)
    kind: str = "layer"  # embed | layer | head
    act_matmul_elems: float = 0.0  # outputs of its matmul and attention ops (kept by op-level selective checkpointing)


@dataclass(frozen=True)
class Workload:
    name: str
    blocks: tuple[Block, ...]
    tokens_per_sample: int = 1
    arch: Arch | None = None
    import_path: str | None = None
    notes: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def params(self) -> int:
        return sum(b.params for b in self.blocks)

    @property
    def layers(self) -> tuple[Block, ...]:
        return tuple(b for b in self.blocks if b.kind == "layer")

    @property
    def fwd_flops(self) -> float:
        return sum(b.fwd_flops for b in self.blocks)

    @property
    def train_flops(self) -> float:
        return sum(b.fwd_flops + b.bwd_flops for b in self.blocks)


# Presets. Sizes follow the public model cards; vit-630m is the seed article's ViT.
PRESETS: dict[str, Arch] = {
    "vit-630m": Arch("vit", hidden=1024, layers=50, heads=16, ffn=4096, image=224, patch=16, classes=1000),
    "bert-large": Arch("bert", hidden=1024, layers=24, heads=16, ffn=4096, seq_len=512, vocab=30522),
    "gpt2-xl": Arch("gpt", hidden=1600, layers=48, heads=25, ffn=6400, seq_len=1024, vocab=50257),
    "gpt-10b": Arch("gpt", hidden=5120, layers=32, heads=40, ffn=20480, seq_len=2048, vocab=50257),
    "gpt-100b": Arch("gpt", hidden=10240, layers=80, heads=80, ffn=40960, seq_len=2048, vocab=50257),
    # Small models that train in seconds on a CPU (tests, emulated-cluster validation).
    "tiny-gpt": Arch("gpt", hidden=64, layers=4, heads=4, ffn=256, seq_len=32, vocab=256),
    "tiny-vit": Arch("vit", hidden=64, layers=4, heads=4, ffn=256, image=32, patch=8, channels=3, classes=10),
    "tiny-mlp": Arch("mlp", hidden=64, layers=4, ffn=256, classes=10),
    "small-gpt": Arch("gpt", hidden=256, layers=8, heads=8, ffn=1024, seq_len=128, vocab=4096),
    "mlp-4x16k": Arch("mlp", hidden=4096, layers=4, ffn=16384, classes=1000),
}


def _layer_block(a: Arch, index: int) -> Block:
    """A transformer layer (pre-LN, biases, GELU MLP) or an MLP block (Linear-GELU-Linear + residual)."""
    h, f, s = a.hidden, a.ffn_size, a.tokens
    if a.family == "mlp":
        params = 2 * h * f + f + h
        fwd = 2.0 * s * (2 * h * f)
        # Backward: input and weight gradients of fc1 and fc2, except that the first block of a
        # model without an embedding gets the raw batch, which needs no gradient: autograd skips
        # fc1's input gradient there (torch measures 3/4 of 2 * fwd).
        bwd = 2 * fwd - (2.0 * s * h * f if index == 0 else 0.0)
        # memory-bound: GELU reads/writes f, residual add reads 2h writes h
        mem = s * (2 * f + 3 * h)
        act = s * (h + 2 * f)  # fc1 input, fc1 output (GELU input), GELU output (fc2 input)
        return Block(f"block{index}", params, fwd, bwd, mem, act, s * h, s * h, act_matmul_elems=s * (f + h))
    params = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h  # attn (qkv+proj, biases), MLP, 2 LayerNorms
    matmul = 2.0 * s * (4 * h * h + 2 * h * f)
    # QK^T and PV: 2 batched matmuls of s*s*h MACs each. Counted in full even when causal, as
    # torch's FlopCounterMode counts the fused SDPA kernels (the work a causal kernel skips is
    # not subtracted; a known over-count of up to 2x on the attention part for gpt).
    attn = 4.0 * s * s * h
    fwd = matmul + attn
    # Backward: 2x the forward for the matmuls (input + weight gradients); 2.5x for attention,
    # because the fused kernels recompute QK^T in backward: 5 bmm against 2 in forward (that is
    # FlopCounterMode's formula for the flash/efficient/cudnn SDPA backward).
    bwd = 2 * matmul + 2.5 * attn
    # Memory-bound forward traffic (assumption, named): 2 LayerNorms (read+write s*h each),
    # 2 residual adds (read 2, write 1), GELU (read+write s*f), attention softmax fused in SDPA.
    mem = s * (2 * 2 * h + 2 * 3 * h + 2 * f)
    # Saved for backward (flash/efficient SDPA keeps no s*s matrix): LN1 in, LN1 out, q, k, v,
    # attention out, LN2 in, LN2 out, fc1 out, GELU out; the softmax log-sum-exp per head and
    # token; the mean and rstd per token of each LayerNorm.
    act = s * (8 * h + 2 * f) + s * a.heads + 2 * 2 * s
    # Matmul and attention outputs: qkv (3h), attention out (h) and its log-sum-exp per head,
    # out projection (h), fc1 (f), fc2 (h)
    mm = s * (6 * h + f) + s * a.heads
    return Block(f"layer{index}", params, fwd, bwd, mem, act, s * h, s * h, act_matmul_elems=mm)


def _embed_block(a: Arch) -> Block | None:
    h, s = a.hidden, a.tokens
    if a.family == "mlp":
        return None
    if a.family == "vit":
        patch_in = a.channels * a.patch * a.patch
        n_patches = s - 1
        params = patch_in * h + h + h + s * h  # conv weight+bias, [CLS], positions
        fwd = 2.0 * n_patches * patch_in * h
        # backward = forward: the image needs no gradient, only the conv weight gradient is computed.
        # memory-bound: [CLS] concat (reads the patches, writes s*h), position add (reads s*h, writes s*h)
        mem = n_patches * h + 3 * s * h
        # saved: the image (conv input)
        return Block("embed", params, fwd, fwd, mem, n_patches * patch_in, a.channels * a.image**2, s * h, "embed")
    params = a.vocab * h + s * h  # token + position embeddings
    # saved: the token ids (the embedding's backward needs them)
    return Block("embed", params, 0.0, 0.0, 3 * s * h, s, s, s * h, "embed")


def _head_block(a: Arch) -> Block:
    # The head's figures include the cross-entropy loss, which saves its log-softmax output
    # (one element per logit) and the targets (one per prediction).
    h, s = a.hidden, a.tokens
    if a.family == "mlp":
        params = h * a.classes + a.classes
        fwd = 2.0 * h * a.classes
        act = h + a.classes + 1  # classifier input, log-softmax, target
        return Block("head", params, fwd, 2 * fwd, 2 * a.classes, act, h, a.classes, "head")
    if a.family == "vit":
        # final LayerNorm on all tokens, classifier on [CLS]; the classifier saves its input, a
        # view of the whole LayerNorm output, which keeps all s*h elements alive
        params = 2 * h + h * a.classes + a.classes
        fwd = 2.0 * h * a.classes
        act = 2 * s * h + 2 * s + a.classes + 1  # LN in, LN out, LN mean+rstd, log-softmax, target
        return Block("head", params, fwd, 2 * fwd, 2 * s * h, act, s * h, a.classes, "head")
    # final LayerNorm + untied LM head over every token
    params = 2 * h + h * a.vocab
    fwd = 2.0 * s * h * a.vocab
    act = 2 * s * h + 2 * s + s * a.vocab + s  # LN in, LN out, LN mean+rstd, log-softmax, targets
    return Block("head", params, fwd, 2 * fwd, 2 * s * h + 3 * s * a.vocab, act, s * h, s * a.vocab, "head")


def from_arch(name: str, a: Arch) -> Workload:
    """The analytic workload of a preset architecture."""
    blocks: list[Block] = []
    emb = _embed_block(a)
    if emb is not None:
        blocks.append(emb)
    blocks.extend(_layer_block(a, i) for i in range(a.layers))
    blocks.append(_head_block(a))
    return Workload(name=name, blocks=tuple(blocks), tokens_per_sample=a.tokens, arch=a)


def load_workload(name: str) -> Workload:
    """A preset by name, or a torch model given as ``pkg.module:build_fn`` (measured on meta)."""
    if name in PRESETS:
        return from_arch(name, PRESETS[name])
    if ":" in name:
        from shardsim.simulator.workload.measure import measure_import_path  # imports torch, only here

        return measure_import_path(name)
    known = ", ".join(PRESETS)
    raise ConfigError(f"unknown workload {name!r}; known presets: {known} (or give pkg.module:build_fn)")


def with_blocks(w: Workload, blocks: list[Block]) -> Workload:
    return replace(w, blocks=tuple(blocks))


def stage_ranges(n_layers: int, pp: int) -> list[tuple[int, int]]:
    """Layers [start, end) of each pipeline stage: as even as possible, earlier stages take
    the remainder (numpy.array_split). The embedding joins stage 0, the head the last stage.
    The runtime splits its model with this same function."""
    base, extra = divmod(n_layers, pp)
    out, start = [], 0
    for s in range(pp):
        end = start + base + (1 if s < extra else 0)
        out.append((start, end))
        start = end
    return out
