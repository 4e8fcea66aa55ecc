"""Analytic costing of every family, block by block, without torch: parameters, FLOPs,
memory-bound traffic and saved activations per sample. A test checks each figure against what
torch measures on the runtime's own modules on the meta device (`workload.measure`).

FLOP convention (2 per multiply-add): matmuls in full; attention as the fused kernels do the
work: the s*s products of QK^T and PV in full for bidirectional attention, half of them for
causal attention (a causal kernel skips the masked blocks; the diagonal's extra s/2 is not
counted). The measurement counts the same way, and `mfu` is computed from these FLOPs.

A mixture-of-experts MLP is costed as the natural torch modules hold it: the router an
``nn.Linear(hidden, experts, bias=False)``; the routed experts stacked weights ``w1``, ``w3``
[experts, hidden, expert_ffn] and ``w2`` [experts, expert_ffn, hidden], as torchtitan's
GroupedExperts (each token through top_k of them: its FLOPs the active ones); the shared expert a
SwiGLU MLP of shared_ffn (gate and up, down), its optional gate an ``nn.Linear(hidden, 1)``.
Latent attention as Transformers' DeepseekV3Attention: q_a_proj, q_a_layernorm, q_b_proj (or
q_proj), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsim.core.errors import ConfigError
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.workload import Block, MoELayer, Workload


def _norm_saved(a: Arch) -> int:
    """Per-token elements a norm saves for backward besides its input: LayerNorm its mean and
    rstd; RMSNorm its rstd and the normalized input (nn.RMSNorm as torch runs it on the meta
    device and the CPU: composite ops, not a fused kernel; named, a fused kernel saves less)."""
    return a.hidden + 1 if a.traits.norm == "rmsnorm" else 2


def norm_params(a: Arch) -> int:
    return 2 * a.hidden if a.traits.norm == "layernorm" else a.hidden


def norm_tensors(a: Arch) -> int:
    """Parameter tensors of one norm: LayerNorm's weight and bias, or a weight alone."""
    return 2 if a.traits.norm == "layernorm" else 1


def attention_flops(a: Arch) -> float:
    """Forward FLOPs of QK^T and PV per sample, as the fused kernel does the work (latent
    attention: its queries and keys `qk_head_dim` wide, its values `v_head_dim`)."""
    if a.mla:
        full = 2.0 * a.tokens * a.tokens * a.heads * (a.qk_head_dim + a.v_head_dim)
    else:
        full = 4.0 * a.tokens * a.tokens * a.q_dim
    return full / 2 if a.traits.causal else full


def kv_heads_per_rank(a: Arch, tp: int) -> int:
    """Key/value heads one tensor-parallel rank holds: kv / tp, or 1 when tp exceeds kv (each
    key/value head replicated over tp / kv ranks, as Megatron-LM does; `config.tp` checks kv | tp)."""
    return max(1, a.kv // tp)


def _dtensor(params: int, plain: int, tp: int) -> int:
    """Of a tensor-parallel rank's `params`, those DTensors hold: all but the `plain` ones (the
    norms without sequence parallelism, as `runtime.strategies.tensor_parallel` leaves them); 0
    without tensor parallelism."""
    return params - plain if tp > 1 else 0


@dataclass(frozen=True)
class _Part:
    """One part of a transformer layer (its attention, its MLP) per sample on one rank: the
    weights its matmuls multiply per token, its parameters, its forward memory-bound elements,
    what it saves for backward (and of that, what matmuls wrote), its parameter tensors and
    the largest, the parameters left plain under tensor parallelism, those a token does not use."""

    weights: int
    params: int
    mem: int
    act: int
    act_mm: int
    tensors: int
    largest: int
    plain: int = 0
    inactive: int = 0


def _attention(a: Arch, tp: int) -> _Part:
    """Grouped-query attention on one of `tp` ranks (its heads): the fused q/k/v projection (its
    biases with `qkv_bias` or the family's), the output projection, rotary embeddings and q/k
    norms; what it saves: the fused qkv output (v is a view of it), the rotated q and k (rotary),
    attention out and its log-sum-exp per head and token, the q/k norms' inputs and statistics."""
    h, s, hd = a.hidden, a.tokens, a.head_dim
    kvd = kv_heads_per_rank(a, tp) * hd if tp > 1 else a.kv_dim
    hq = a.q_dim // tp  # this rank's query width (heads / tp)
    qkv = hq + 2 * kvd  # fused q, k, v projection width
    qk_norm = 2 * hd if a.qk_norm else 0  # the q and k norms' weights, replicated
    weights = h * qkv + hq * h
    params = weights + qk_norm + (qkv + h if a.traits.bias else qkv if a.qkv_bias else 0)
    rope = a.position_kind == "rope"
    mem = (10 * s * (hq + kvd) if rope else 0) + (2 * s * (hq + kvd) if qk_norm else 0)
    act = s * (qkv + hq + a.heads // tp) + (s * (hq + kvd) if rope else 0)
    if qk_norm:  # per head and token its normalized input and rstd (and, unrotated, its output attention saves)
        act += s * (hq + kvd) + s * (hq + kvd) // hd + (0 if rope else s * (hq + kvd))
    act_mm = s * (qkv + hq + a.heads // tp)
    tensors = 2 * (2 if a.traits.bias else 1) + (1 if a.qkv_bias and not a.traits.bias else 0) + (2 if qk_norm else 0)
    return _Part(weights, params, mem, act, act_mm, tensors, h * qkv, plain=qk_norm)


def _latent_attention(a: Arch) -> _Part:
    """Multi-head latent attention as DeepSeek-V3's modelling code runs it (Transformers'
    DeepSeek-V3's modelling code): queries through q_a (hidden -> q_lora_rank), its RMSNorm and q_b
    (-> heads x (head_size + rope_head_size)), or one projection without a query latent; keys and
    values through kv_a (hidden -> kv_lora_rank + rope_head_size: the latent and the shared
    rotated key), its RMSNorm and kv_b (-> heads x (head_size + v_head_size)); q and k concatenated
    from their unrotated and rotated parts, attention, and o (heads x v_head_size -> hidden).
    Saved: each latent norm's input, output and statistics (kv_a's whole output), kv_b's output
    (v is a view of it), the concatenated q and k, attention out and its log-sum-exp."""
    h, s, heads = a.hidden, a.tokens, a.heads
    qr, kvr, dr, dqk, dv = a.q_lora_rank, a.kv_lora_rank, a.rope_head_size, a.qk_head_dim, a.v_head_dim
    q_mats = (h * qr, qr * heads * dqk) if qr else (h * heads * dqk,)
    mats = (*q_mats, h * (kvr + dr), kvr * heads * (a.head_dim + dv), heads * dv * h)
    weights = sum(mats)
    params = weights + qr + kvr  # the latent norms' weights
    # the latent norms (read + write), rotary on the rotated q and k parts, q and k concatenated (read + write)
    mem = s * (2 * (qr + kvr) + 10 * (heads * dr + dr) + 4 * heads * dqk)
    q_norm = 3 * qr + 1 if qr else 0
    kv_b_out = heads * (a.head_dim + dv)
    act = s * (q_norm + 3 * kvr + dr + 1 + kv_b_out + 2 * heads * dqk + heads * dv + heads)
    act_mm = s * (qr + kvr + dr + kv_b_out + heads * dqk + heads * dv + heads)
    tensors = len(mats) + (2 if qr else 1)
    return _Part(weights, params, mem, act, act_mm, tensors, max(mats))


def _dense_mlp(a: Arch, tp: int) -> _Part:
    """The MLP (GELU: fc1, fc2; SwiGLU: gate, up, down; biases where the family has them) on one
    of `tp` ranks; it saves GELU's fc1 out and GELU out, or SwiGLU's gate out, up out, SiLU out
    and the product."""
    h, s, f = a.hidden, a.tokens, a.ffn_size // tp
    swiglu = a.traits.mlp == "swiglu"
    mats = 3 if swiglu else 2
    params = mats * h * f + ((mats - 1) * f + h if a.traits.bias else 0)
    act = s * (4 * f if swiglu else 2 * f)
    act_mm = s * (2 * f if swiglu else f)
    tensors = mats * (2 if a.traits.bias else 1)
    return _Part(mats * h * f, params, s * (5 * f if swiglu else 2 * f), act, act_mm, tensors, h * f)


def _moe_mlp(a: Arch, tp: int, etp: int | None = None) -> tuple[_Part, MoELayer]:
    """A mixture-of-experts MLP on one of `tp` ranks (each expert's inner size an `etp`-th, tp
    unless given), every expert held (expert parallelism 1); with etp < tp (expert parallelism
    borrowing tensor-parallel ranks: torchtitan's etp 1) the router's tokens split over the tp / etp
    ranks before dispatch, each routing its share to whole experts. The router's matmul, its
    softmax and top-k; the tokens permuted into expert order (a gather of tokens x top_k rows);
    the routed experts' SwiGLU as grouped GEMMs over those rows (the FLOPs are the active ones:
    top_k experts a token); the outputs scaled by their routing weights and scattered back
    (un-permuted) and summed per token; the shared expert a dense SwiGLU MLP beside (its output gated by a sigmoid of a
    hidden -> 1 projection with `shared_gate`). Saved, as torchtitan's MoE saves them
    (models/common/moe.py, token_dispatcher.py): the router's probabilities, the top-k indices, the
    sort order into expert order and each row's token index (integers), the sorted gate values, the
    permuted tokens (the grouped GEMMs' input), the routed SwiGLU's four tensors per row, the
    experts' output (what the weighting saves; the combining scatter-add saves only its index),
    the shared expert's four, and with the gate its sigmoid and the shared expert's output. Of
    those, matmuls wrote the experts' gate and up outputs and the shared expert's (and, gated, its
    output): the router's logits are not saved (its softmax saves its output) and the experts'
    output the weighting saves is a copy (torchtitan casts the grouped GEMM's output to float32)."""
    h, s, k, e = a.hidden, a.tokens, a.top_k, a.experts
    etp = tp if etp is None else etp
    fe, sf = a.expert_ffn_size // etp, a.shared_ffn // tp
    moe = MoELayer(e, k, h, fe, sf, s, a.shared_gate, split=tp // etp)
    rows = moe.routed_rows
    gate = h if a.shared_gate else 0
    weights = h * e + k * moe.expert_params // moe.split + 3 * h * sf + gate
    params = h * e + e * moe.expert_params + 3 * h * sf + gate
    # router softmax (read + write) and top-k (read, write values and indices), the weights normalized
    router = 3 * s * e + 4 * s * k
    permute, unpermute = 2 * rows * h, 3 * rows * h + 2 * s * h  # gather; weight, scatter-add into the output
    shared = (5 * s * sf + 3 * s * h if sf else 0) + (3 * s * h + 2 * s if gate else 0)
    mem = router + permute + 5 * rows * fe + unpermute + shared
    act = s * (e + 4 * k) + rows * (2 * h + 4 * fe) + 4 * s * sf + (s * (h + 1) if gate else 0)
    act_mm = rows * 2 * fe + 2 * s * sf + (s * h if gate else 0)
    tensors = 1 + 3 + (3 if sf else 0) + (1 if gate else 0)
    part = _Part(weights, params, mem, act, act_mm, tensors, e * h * fe, inactive=(e - k) * moe.expert_params)
    return part, moe


def _layer(a: Arch, index: int, tp: int = 1, sp: bool = False, etp: int | None = None) -> Block:
    """A pre-norm transformer layer of any family (see `Traits`), as one of `tp` tensor-parallel
    ranks runs it (Megatron's split: q/k/v and the MLP's first matrices by columns, attention's
    output projection and the MLP's last matrix by rows, attention by heads); with sequence
    parallelism (`sp`) the norms and residual adds on a tp-th of the tokens, the column-parallel
    matrices' inputs gathered whole (what they save for backward). Norms and the row-parallel
    matrices' biases are replicated. Its attention is grouped-query or latent (`Arch.mla`), its
    MLP dense or a mixture of experts (`Arch.is_moe_layer`; its experts an `etp`-th each, `_moe_mlp`)."""
    h, s = a.hidden, a.tokens
    sn = s // tp if sp else s  # tokens the norms and residuals see
    att = _latent_attention(a) if a.mla else _attention(a, tp)
    moe = None
    if a.is_moe_layer(index):
        mlp, moe = _moe_mlp(a, tp, etp)
    else:
        mlp = _dense_mlp(a, tp)
    params = att.params + mlp.params + 2 * norm_params(a)
    matmul = 2.0 * s * (att.weights + mlp.weights)
    attn = attention_flops(a) / tp
    fwd = matmul + attn
    # Backward: 2x the forward for the matmuls (input + weight gradients); 2.5x for attention,
    # because the fused kernels recompute QK^T in backward: 5 bmm against 2 in forward (that is
    # FlopCounterMode's formula for the flash/efficient/cudnn SDPA backward).
    bwd = 2 * matmul + 2.5 * attn
    # Memory-bound forward traffic (assumption, named): 2 norms (read+write s*h each), 2 residual
    # adds (read 2, write 1), the MLP's (the activation: GELU read+write s*f; SwiGLU SiLU read+write
    # s*f and the product read 2 write 1; an MoE MLP's routing, permutation and combination),
    # attention's (rotary embeddings: about 10 reads and writes per rotated element of q and k;
    # q/k norms), attention softmax fused in SDPA.
    mem = sn * (2 * 2 * h + 2 * 3 * h) + mlp.mem + att.mem
    # Saved for backward (flash/efficient SDPA keeps no s*s matrix): per norm its input, output
    # and per-token statistics (with sequence parallelism a tp-th of them, and the column-parallel
    # matrix's gathered input beside); then the attention's and the MLP's own.
    norms = 2 * (sn * (2 * h + _norm_saved(a)) + (s * h if sp else 0))
    act = norms + att.act + mlp.act
    # Of those, the outputs of matmuls and of the attention kernel (op-level selective
    # checkpointing keeps these): qkv, attention out and log-sum-exp, fc1 (gate and up).
    act_mm = att.act_mm + mlp.act_mm
    norms_plain = 0 if sp else 2 * norm_params(a)
    return Block(
        f"layer{index}", params, fwd, bwd, mem, act, sn * h, sn * h, act_matmul_elems=act_mm,
        param_tensors=att.tensors + mlp.tensors + 2 * norm_tensors(a), largest_tensor=max(att.largest, mlp.largest),
        dtensor_params=_dtensor(params, norms_plain + att.plain, tp), inactive_params=mlp.inactive, moe=moe,
    )  # fmt: skip


def _mlp_block(a: Arch, index: int) -> Block:
    """An MLP block (Linear-GELU-Linear + residual)."""
    h, f, s = a.hidden, a.ffn_size, a.tokens
    params = 2 * h * f + f + h
    fwd = 2.0 * s * (2 * h * f)
    # Backward: input and weight gradients of fc1 and fc2, except that the first block of a
    # model without an embedding gets the raw batch, which needs no gradient: autograd skips
    # fc1's input gradient there (torch measures 3/4 of 2 * fwd).
    bwd = 2 * fwd - (2.0 * s * h * f if index == 0 else 0.0)
    # memory-bound: GELU reads/writes f, residual add reads 2h writes h
    mem = s * (2 * f + 3 * h)
    act = s * (h + 2 * f)  # fc1 input, fc1 output (GELU input), GELU output (fc2 input)
    # fc1 and fc2, each a weight and a bias
    return Block(f"block{index}", params, fwd, bwd, mem, act, s * h, s * h, act_matmul_elems=s * f, param_tensors=4,
                 largest_tensor=h * f)  # fmt: skip


def _embed(a: Arch, tp: int = 1, sp: bool = False) -> Block | None:
    """The embedding as one of `tp` ranks runs it: a text model's token table split by vocabulary
    rows (ceil(vocab / tp) each), learned positions replicated (split along the sequence with
    sequence parallelism), its output whole (a tp-th of the tokens with sequence parallelism);
    a ViT's patch embedding replicated."""
    h, s = a.hidden, a.tokens
    sn = s // tp if sp else s
    if a.spec.embed == "none":
        return None
    if a.spec.embed == "patches":
        patch_in = a.channels * a.patch * a.patch
        n_patches = s - 1
        params = patch_in * h + h + h + s * h  # conv weight+bias, [CLS], positions
        fwd = 2.0 * n_patches * patch_in * h
        # backward = forward: the image needs no gradient, only the conv weight gradient is computed.
        # memory-bound: [CLS] concat (reads the patches, writes s*h), position add (reads s*h, writes s*h)
        mem = n_patches * h + 3 * s * h
        # saved: the image (conv input); parameter tensors: conv weight and bias, [CLS], positions
        saved, image = n_patches * patch_in, a.channels * a.image**2
        largest = max(patch_in * h, s * h)
        return Block("embed", params, fwd, fwd, mem, saved, image, s * h, "embed", 0.0, 4, largest)
    # Token embeddings (+ learned positions); rotary and ALiBi positions have no parameters.
    # A tied LM head's matrix is counted here, once (the head costs its matmul, not its weight).
    learned = a.position_kind == "learned"
    rows = -(-a.vocab // tp)
    params = rows * h + (sn * h if learned else 0)
    mem = 3 * sn * h if learned else sn * h
    # saved: the token ids (the embedding's backward needs them)
    tensors = 2 if learned else 1
    dt = _dtensor(params, 0, tp)  # the token table and the positions: DTensors (`runtime.strategies.tensor_parallel`)
    return Block("embed", params, 0.0, 0.0, mem, s, s, sn * h, "embed", 0.0, tensors, rows * h, dtensor_params=dt)


def masked_tokens(a: Arch, fraction: float) -> int:
    """Positions per sequence a masked-LM head predicts: round(fraction x tokens), at least 1
    (NVIDIA's BERT pretraining: max_predictions_per_seq, 20 of 128 and 80 of 512)."""
    return max(1, round(fraction * a.tokens))


def check_mlm(a: Arch | None, fraction: float | None, where: str | None = None) -> None:
    """ConfigError naming mlm_fraction unless the model is a bidirectional text model (bert)."""
    if fraction is None:
        return
    if a is None or a.traits.tokens != "text" or a.traits.causal:
        what = "a model built by Python" if a is None else f"the {a.family} family"
        why = f"a masked-LM head applies to a bidirectional text model (bert), not {what}"
        raise ConfigError(why, where=where, field="mlm_fraction")


def _masked_head(a: Arch, tp: int, sp: bool, k: int) -> Block:
    """The masked-LM head on `k` positions per sequence: the hidden states of those positions
    gathered (read and written, k x h), then the final norm, the LM head (vocabulary columns
    over `tp` ranks) and the cross-entropy on k tokens only; its input stays the whole
    sequence's (what the layer before hands it)."""
    h, s = a.hidden, a.tokens
    sn = s // tp if sp else s
    v = -(-a.vocab // tp)
    params = norm_params(a) + (0 if a.tied_embeddings else h * v)
    fwd = 2.0 * k * h * v
    # gathered positions, norm out, its statistics, log-softmax, targets (and the gathered sequence under sp)
    act = k * (2 * h + _norm_saved(a)) + (s * h if sp else 0) + k * v + k
    mem = 2 * k * h + 2 * k * h + 3 * k * v
    tensors = norm_tensors(a) + (0 if a.tied_embeddings else 1)
    dt = _dtensor(params, 0 if sp else norm_params(a), tp)
    return Block(
        "head", params, fwd, 2 * fwd, mem, act, sn * h, k * v, "head", 0.0, tensors, tokens=k, dtensor_params=dt
    )


def _head(a: Arch, tp: int = 1, sp: bool = False) -> Block:
    """The head as one of `tp` ranks runs it: an LM head split by vocabulary columns with the
    vocabulary-parallel cross-entropy (each rank its tp-th of the logits), its final norm on a
    tp-th of the tokens with sequence parallelism (its output gathered whole for the matmul);
    a classifier replicated."""
    # The head's figures include the cross-entropy loss, which saves its log-softmax output
    # (one element per logit) and the targets (one per prediction).
    h, s = a.hidden, a.tokens
    if a.spec.head == "linear":
        params = h * a.classes + a.classes
        fwd = 2.0 * h * a.classes
        act = h + a.classes + 1  # classifier input, log-softmax, target
        return Block("head", params, fwd, 2 * fwd, 2 * a.classes, act, h, a.classes, "head", 0.0, 2, h * a.classes)
    if a.spec.head == "cls":
        # final LayerNorm on all tokens, classifier on [CLS]; the classifier saves its input, a
        # view of the whole LayerNorm output, which keeps all s*h elements alive
        params = 2 * h + h * a.classes + a.classes
        fwd = 2.0 * h * a.classes
        act = 2 * s * h + 2 * s + a.classes + 1  # LN in, LN out, LN mean+rstd, log-softmax, target
        sn = s // tp if sp else s
        tensors = 2 + norm_tensors(a)
        return Block(
            "head", params, fwd, 2 * fwd, 2 * s * h, act, sn * h, a.classes, "head", 0.0, tensors, h * a.classes
        )
    # final norm + LM head over every token (its matrix tied to the embedding's, or its own)
    sn = s // tp if sp else s
    v = -(-a.vocab // tp)  # this rank's vocabulary columns
    params = norm_params(a) + (0 if a.tied_embeddings else h * v)
    fwd = 2.0 * s * h * v
    stats = _norm_saved(a)
    # norm in, norm out (and the gathered out with sequence parallelism), its statistics, log-softmax, targets
    act = sn * (2 * h + stats) + (s * h if sp else 0) + s * v + s
    tensors = norm_tensors(a) + (0 if a.tied_embeddings else 1)
    mem = 2 * sn * h + 3 * s * v
    largest = h if a.tied_embeddings else h * v  # the norm's weight, or the LM head's matrix
    dt = _dtensor(params, 0 if sp else norm_params(a), tp)
    return Block(
        "head", params, fwd, 2 * fwd, mem, act, sn * h, s * v, "head", 0.0, tensors, largest, dtensor_params=dt
    )


def from_arch(
    name: str,
    a: Arch,
    tp: int = 1,
    sequence_parallel: bool = False,
    mlm_fraction: float | None = None,
    expert_tp: int | None = None,
) -> Workload:
    """The analytic workload of an architecture, as one of `tp` tensor-parallel ranks runs it
    (the whole model with tp = 1; its routed experts split over `expert_tp` ranks, tp unless
    given: `ParallelDims.expert_tp`); with `mlm_fraction` (a bidirectional text model:
    `check_mlm`) its head a masked-LM head on that fraction of the tokens."""
    sp = sequence_parallel and tp > 1
    blocks: list[Block] = []
    emb = _embed(a, tp, sp)
    if emb is not None:
        blocks.append(emb)
    if a.spec.layer == "mlp":
        blocks.extend(_mlp_block(a, i) for i in range(a.layers))
    else:
        blocks.extend(_layer(a, i, tp, sp, expert_tp) for i in range(a.layers))
    if mlm_fraction is None:
        blocks.append(_head(a, tp, sp))
    else:
        check_mlm(a, mlm_fraction)
        blocks.append(_masked_head(a, tp, sp, masked_tokens(a, mlm_fraction)))
    return Workload(name=name, blocks=tuple(blocks), tokens_per_sample=a.tokens, arch=a, tp=tp, sequence_parallel=sp)
