"""A GPU block's time from the kernels it runs: GEMMs at their real shapes, fused attention,
memory-bound kernels, and eager PyTorch's per-kernel floor.

Each choice that bends reality is named where it is made; each figure comes from the
device's file (`KernelSpec`, `device.kernels` in `topologies/*.yaml`) with its source.
- GEMM: tiles of `tile_m × tile_n` outputs spread over the SMs in waves (ceil(tiles / SMs));
  a wave runs at the device's sustained fraction of dense peak (`matmul_efficiency`); the
  smaller of two tile shapes is taken where it quantizes better (as cuBLAS's heuristics
  choose among tile configurations); split-K fills the SMs when a GEMM has fewer tiles than
  SMs (weight gradients: small output, long inner dimension); a GEMM whose operands take
  longer to stream from HBM than to multiply is memory-bound (roofline).
- Attention: fused (flash / memory-efficient SDPA) kernels, at a throughput per pass that
  rises with the length of the key loop as s / (s + s_half) towards the device's long-sequence
  rate; causal work counted as the kernel does it (half the score matrix, the key loop half
  as long on average).
- Memory-bound kernels (norms, activations, residual adds, softmax / cross-entropy,
  embedding): their bytes at the achieved HBM bandwidth, split evenly over the kernels a pass
  launches.
- A training step, not a benchmark: GEMMs run at `gemm_training_fraction` of the GEMM rate
  and attention at `attn_training_fraction` of its rates (applied by `compute.ComputeModel`).
- Stragglers: ranks that synchronize every step run at the pace of the slowest; a rank's
  compute time varies across ranks with coefficient of variation `rank_time_cv` (normal), so
  the expected slowest of N is 1 + cv · E[max of N standard normals] (Blom's approximation).
- Eager floor: a kernel costs at least `kernel_floor_us` (launch and dispatch on the host):
  time of a pass = Σ max(kernel, floor). It decides small microbatches.
- Mixture of experts (`GroupedGemm`): the routed experts' GEMMs are grouped GEMMs
  (torch._grouped_mm, CUTLASS's persistent grouped kernel), one group an expert, its rows the
  token copies routed to it. All groups' tiles share the SMs; a group's last tile is on average
  half empty; the kernel ends, on average, half of its longest tile after the mean SM (the
  tail). With expert parallelism 1 the load imbalance (the busiest expert's rows over the mean)
  enters only so: the busiest group's rows are imbalance x the mean and the others share the
  rest evenly; in the weight gradient (inner dimension: a group's rows) the busiest group's
  tiles are the longest and set the tail. A capacity factor caps every group's rows (the rows
  beyond it dropped). The rate is `GROUPED_GEMM_EFFICIENCY` of a dense GEMM's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

from shardsim.specs.hardware.topology import KernelSpec
from shardsim.specs.model.blocks import kv_heads_per_rank
from shardsim.specs.model.workload import Arch, Block, MoELayer

SPLIT_K_MIN = 256  # split-K keeps at least this many inner elements per split (assumption, named)
SMALL_TILE_EFFICIENCY = 0.9  # a 128×128 tile sustains less than a 256×128 one (less reuse per load; assumption)
BWD_ATTN_WORK = 2.5  # fused attention backward: 5 matmuls of the forward's 2 (QK^T recomputed)
ATTN_SMALL_HDIM = 64  # head dimension at or below which `attn_small_hdim_factor` applies
# A grouped GEMM's rate against a dense GEMM's: pytorch/pytorch PR #156203 timed torch._grouped_mm
# (CUTLASS sm90) on H200 at 16 groups of 128,000 x 7,168 x 7,168 in bf16: 298.67 ms, 704.6 TFLOP/s;
# the best measured dense BF16 GEMM on the same tensor cores (H100 SXM, stas00/ml-engineering, the
# topologies' matmul_efficiency) runs 795 TFLOP/s: 704.6 / 795 = 0.886. Large, even groups: uneven
# and small groups are costed by their tiles (`grouped_gemm_time`), not by this factor.
GROUPED_GEMM_EFFICIENCY = 0.886


@dataclass(frozen=True)
class Gemm:
    """C[m×n] = A[m×k] · B[k×n], `count` times."""

    m: int
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class GroupedGemm:
    """One grouped GEMM over `groups` experts, each C[m_e×n] = A[m_e×k] · B_e[k×n], `rows` = Σ m_e
    (`inner_rows`: a weight gradient, each group's C[n×k] = A_eᵀ · B_e with inner dimension m_e);
    the busiest group has `busiest` rows, the others share the rest evenly."""

    groups: int
    rows: float
    busiest: float
    n: int
    k: int
    inner_rows: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.rows * self.n * self.k

    @property
    def other_rows(self) -> float:
        """Rows of each group but the busiest."""
        return (self.rows - self.busiest) / (self.groups - 1) if self.groups > 1 else 0.0

    @property
    def bwd(self) -> tuple[GroupedGemm, GroupedGemm]:
        """Its input gradient (rows x k from rows x n) and its weight gradient (n x k per group, inner rows)."""
        return (
            GroupedGemm(self.groups, self.rows, self.busiest, self.k, self.n),
            GroupedGemm(self.groups, self.rows, self.busiest, self.n, self.k, inner_rows=True),
        )


@dataclass(frozen=True)
class Attention:
    """One fused attention call: `batch_heads` independent (seq × seq) problems of `head_dim`."""

    batch_heads: int
    seq: int
    head_dim: int
    causal: bool

    @property
    def fwd_flops(self) -> float:
        """QK^T and PV as the kernel does them: half the score matrix when causal."""
        full = 4.0 * self.batch_heads * self.seq * self.seq * self.head_dim
        return full / 2 if self.causal else full


@dataclass(frozen=True)
class BlockKernels:
    """What one block runs for one microbatch: GEMMs per pass, its attention call, and the
    number of other (memory-bound) kernels each pass launches."""

    fwd_gemms: tuple[Gemm, ...]
    attention: Attention | None
    fwd_other_kernels: int
    bwd_other_kernels: int
    input_grad: bool = True  # False: the block's input needs no gradient (the first GEMM's dgrad is skipped)
    grouped: tuple[GroupedGemm, ...] = ()  # an MoE layer's routed experts (w1, w3, w2)
    moe: MoEKernels | None = None  # an MoE layer's other kernels, by part

    @property
    def bwd_grouped(self) -> tuple[GroupedGemm, ...]:
        return tuple(b for g in self.grouped for b in g.bwd)

    @property
    def bwd_gemms(self) -> tuple[Gemm, ...]:
        """Input gradient dX[m×k] = dY[m×n]·Wᵀ and weight gradient dW[n×k] = dYᵀ·X (inner m)."""
        out: list[Gemm] = []
        for i, g in enumerate(self.fwd_gemms):
            if self.input_grad or i > 0:
                out.append(Gemm(g.m, g.k, g.n, g.count))
            out.append(Gemm(g.n, g.k, g.m, g.count))
        return tuple(out)


@dataclass(frozen=True)
class MoEKernels:
    """An MoE layer's work beside its grouped GEMMs, per microbatch, by part: the router's GEMM
    and the shared expert's GEMMs (each among `BlockKernels.fwd_gemms` too), and the memory-bound
    elements of routing (softmax, top-k) and of permuting and un-permuting the tokens."""

    router: Gemm
    shared: tuple[Gemm, ...]
    router_elems: float
    permute_elems: float


# Kernels other than GEMMs and attention that the runtime's modules launch per pass in eager
# mode (counted from runtime/models/transformer.py; named here, they set the floor's weight).
# Transformer layer forward: LN1, head transpose copy, residual add, LN2, GELU, residual add.
# Backward (`layer_bwd_other`): LN1 and LN2 (input grad, weight/bias grad each: 6), GELU, the
# copy, one bias-gradient reduction per biased Linear (4 with biases), 2 residual-gradient adds,
# the attention's pre/post-processing (2), and one gradient accumulation per parameter tensor.
LAYER_FWD_OTHER = 6
LAYER_BWD_FIXED = 6 + 1 + 1 + 2 + 2
# An MoE MLP's kernels beyond a dense one's, each pass (assumption, named; counted from torchtitan's
# MoE: softmax, top-k, the weights' normalization, the tokens' sort by expert, the counts per
# expert, the permuting gather, the routing weights' multiply, the un-permuting scatter-add), and
# the shared expert's add and its gate's sigmoid and multiply.
MOE_OTHER = 8
MOE_SHARED_OTHER = 1
MOE_GATE_OTHER = 2
# Latent attention's kernels beyond grouped-query attention's, each pass (assumption, named): the
# two latent norms, rotary on q and k's rotated parts, q and k concatenated.
MLA_OTHER = 6


def layer_bwd_other(arch: Arch, b: Block) -> int:
    """Kernels other than GEMMs and attention in one transformer layer's backward."""
    linears = 4 + (1 if arch.traits.mlp == "swiglu" else 0)
    return LAYER_BWD_FIXED + (linears if arch.traits.bias else 0) + b.param_tensors + _extra_other(arch, b)


def _extra_other(arch: Arch, b: Block) -> int:
    """An MoE or latent-attention layer's kernels beyond a dense layer's (each pass)."""
    extra = MLA_OTHER if arch.mla else 0
    if b.moe is not None:
        extra += (
            MOE_OTHER + (MOE_SHARED_OTHER if b.moe.shared_ffn else 0) + (MOE_GATE_OTHER if b.moe.shared_gate else 0)
        )
    return extra


MLP_FWD_OTHER = 2  # GELU, residual add
MLP_BWD_OTHER = 1 + 2 + 4  # GELU, bias reductions, gradient accumulation per parameter tensor
EMBED_FWD_OTHER = 2  # token gather (or the [CLS] concat), position add
EMBED_BWD_OTHER = 3  # embedding backward (sort + scatter-add), position gradient reduction
HEAD_FWD_OTHER = 3  # final norm, log-softmax, NLL (cross-entropy over the vocabulary or classes)
HEAD_BWD_OTHER = 4  # NLL and log-softmax backward, norm backward (2)


def routed_rows(
    moe: MoELayer, batch: int, imbalance: float = 1.0, capacity: float = 0.0, ep: int = 1
) -> tuple[float, float]:
    """Rows (token copies) the experts of `moe` held by the busiest of `ep` expert-parallel ranks
    compute when each rank routes `batch` samples, and their busiest expert's: the group's rows
    spread over all experts, the busiest expert imbalance x the mean, the others sharing the rest
    evenly, the busiest rank the one holding the busiest expert and experts / ep - 1 others; with a
    capacity factor (> 0) each expert's rows beyond capacity x the mean dropped."""
    rows = ep * batch * moe.routed_rows
    mean = rows / moe.experts
    busiest = imbalance * mean
    others = (rows - busiest) / (moe.experts - 1) if moe.experts > 1 else 0.0
    if capacity > 0:
        busiest = min(busiest, capacity * mean)
        others = min(others, capacity * mean)
        rows = busiest + (moe.experts - 1) * others
    return rows - (moe.experts - moe.experts // ep) * others, busiest


def _attention_gemms(arch: Arch, t: int, tp: int) -> tuple[Gemm, ...]:
    """A layer's attention projections for `t` tokens on one of `tp` ranks: fused q/k/v and the
    output projection, or latent attention's (`blocks._latent_attention`)."""
    h = arch.hidden
    if arch.mla:
        heads, qr, kvr, dqk, dv = arch.heads, arch.q_lora_rank, arch.kv_lora_rank, arch.qk_head_dim, arch.v_head_dim
        q = (Gemm(t, qr, h), Gemm(t, heads * dqk, qr)) if qr else (Gemm(t, heads * dqk, h),)
        kv = (Gemm(t, kvr + arch.rope_head_size, h), Gemm(t, heads * (arch.head_dim + dv), kvr))
        return (*q, *kv, Gemm(t, h, heads * dv))
    kvd = kv_heads_per_rank(arch, tp) * arch.head_dim if tp > 1 else arch.kv_dim
    hq = arch.q_dim // tp
    return Gemm(t, hq + 2 * kvd, h), Gemm(t, h, hq)


def block_kernels(
    arch: Arch, b: Block, batch: int, tp: int = 1, imbalance: float = 1.0, capacity: float = 0.0, ep: int = 1
) -> BlockKernels | None:
    """The kernels of block `b` of a model of `arch` for a microbatch of `batch` samples, as one
    of `tp` tensor-parallel ranks runs them (its shards of the GEMMs: q/k/v and the MLP's first
    matrices by columns, the output projections by rows, attention by heads, the LM head by
    vocabulary columns; `blocks.from_arch`), or None for a block this function does not know.
    Written from the architecture so that a family with other projections (grouped KV heads,
    gated MLPs) adds its GEMMs here. With expert parallelism (`ep` > 1) an MoE layer's grouped
    GEMMs are the busiest EP rank's: its experts / ep experts over the rows all ranks sent them."""
    h, f = arch.hidden, arch.ffn_size // tp
    t = batch * arch.tokens
    if b.kind == "layer" and not arch.spec.transformer:
        gemms = (Gemm(batch, f, h), Gemm(batch, h, f))
        return BlockKernels(gemms, None, MLP_FWD_OTHER, MLP_BWD_OTHER, input_grad=b.name != "block0")
    if b.kind == "layer":
        # latent attention's heads as heads of the mean of its q/k and v widths (the same FLOPs)
        hd = (arch.qk_head_dim + arch.v_head_dim) // 2 if arch.mla else arch.head_dim
        attn = Attention(batch * arch.heads // tp, arch.tokens, hd, causal=arch.traits.causal)
        other = (LAYER_FWD_OTHER + _extra_other(arch, b), layer_bwd_other(arch, b))
        if b.moe is not None:
            gemms = _attention_gemms(arch, t, tp)
            return _moe_kernels(arch, b.moe, gemms, attn, other, batch, imbalance, capacity, ep)
        gated = arch.traits.mlp == "swiglu"  # gate and up projections: one GEMM of twice the width
        up = Gemm(t, 2 * f if gated else f, h)
        gemms = (*_attention_gemms(arch, t, tp), up, Gemm(t, h, f))
        return BlockKernels(gemms, attn, *other)
    if b.kind == "embed":
        if arch.spec.embed == "patches":
            patch_in = arch.channels * arch.patch * arch.patch
            conv = Gemm(batch * (arch.tokens - 1), h, patch_in)
            return BlockKernels((conv,), None, EMBED_FWD_OTHER, EMBED_BWD_OTHER, input_grad=False)
        return BlockKernels((), None, EMBED_FWD_OTHER, EMBED_BWD_OTHER)
    if b.kind == "head":
        if arch.spec.head != "lm":
            return BlockKernels((Gemm(batch, arch.classes, h),), None, HEAD_FWD_OTHER, HEAD_BWD_OTHER)
        t = batch * (b.tokens or arch.tokens)  # a masked-LM head: its masked positions
        return BlockKernels((Gemm(t, -(-arch.vocab // tp), h),), None, HEAD_FWD_OTHER, HEAD_BWD_OTHER)
    return None


def _moe_kernels(
    arch: Arch,
    moe: MoELayer,
    attention: tuple[Gemm, ...],
    attn: Attention,
    other: tuple[int, int],
    batch: int,
    imbalance: float,
    capacity: float,
    ep: int = 1,
) -> BlockKernels:
    """An MoE layer's kernels: attention's, the router's GEMM, the shared expert's (gate and up as
    one GEMM, down; its gate's hidden -> 1 projection) and the routed experts' grouped GEMMs (w1,
    w3, w2 as torchtitan's GroupedExperts runs them)."""
    h, t, fe, sf = moe.hidden, batch * arch.tokens, moe.expert_ffn, moe.shared_ffn
    router = Gemm(t, moe.experts, h)
    shared = (Gemm(t, 2 * sf, h), Gemm(t, h, sf)) if sf else ()
    if moe.shared_gate:
        shared = (*shared, Gemm(t, 1, h))
    rows, busiest = routed_rows(moe, batch, imbalance, capacity, ep)
    local = moe.experts // ep
    up = GroupedGemm(local, rows, busiest, fe, h)
    grouped = (up, up, GroupedGemm(local, rows, busiest, h, fe))
    s, k, r = batch * arch.tokens, moe.top_k, rows
    parts = MoEKernels(router, shared, 3 * s * moe.experts + 4 * s * k, 2 * r * h + 3 * r * h + 2 * s * h)
    return BlockKernels((*attention, router, *shared), attn, *other, grouped=grouped, moe=parts)


def grouped_gemm_time(
    g: GroupedGemm, spec: KernelSpec, flops_per_s: float, mem_bytes_per_s: float, esize: int
) -> float:
    """Seconds of a grouped GEMM (`GroupedGemm`; the model in the module's docstring): the better
    of the large tile and a 128×128 one, each at `GROUPED_GEMM_EFFICIENCY` of `flops_per_s`; at
    least the time to stream its operands and result through HBM."""
    per_sm = flops_per_s * GROUPED_GEMM_EFFICIENCY / spec.sms
    shapes = ((spec.tile_m, spec.tile_n, 1.0), (spec.tile_n, spec.tile_m, 1.0), (128, 128, SMALL_TILE_EFFICIENCY))
    best = min(_grouped_in_tiles(g, tm, tn, per_sm * eff, spec.sms) for tm, tn, eff in shapes)
    # the rows' two operands (inputs and outputs, or the weight gradient's two inputs) and the groups' weights
    mem = (g.rows * (g.n + g.k) + g.groups * g.n * g.k) * esize / mem_bytes_per_s
    return max(best, mem)


def _grouped_in_tiles(g: GroupedGemm, tm: int, tn: int, per_sm: float, sms: int) -> float:
    """Seconds of `g` in tiles of tm × tn outputs, each SM at `per_sm` FLOP/s: all groups' tiles
    over the SMs, and half the longest tile after (the tail)."""
    tile_s = 2.0 * tm * tn / per_sm  # a tile's seconds per element of its inner dimension
    if g.inner_rows:  # each group's n x k output in tiles, its inner dimension its rows
        work = math.ceil(g.n / tm) * math.ceil(g.k / tn) * tile_s * g.rows
        return work / sms + tile_s * g.busiest / 2

    def row_tiles(m: float) -> float:  # a group's rows in tiles: its last one half empty on average
        return max(1.0, m / tm + 0.5) if m > 0 else 0.0

    tiles = (row_tiles(g.busiest) + (g.groups - 1) * row_tiles(g.other_rows)) * math.ceil(g.n / tn)
    return tiles * tile_s * g.k / sms + tile_s * g.k / 2


@lru_cache(maxsize=256)
def slowest_of(ranks: int, cv: float) -> float:
    """Expected time of the slowest of `ranks` ranks over one rank's mean: 1 + cv · E[max of N
    standard normals], E by Blom's approximation Φ⁻¹((N − 0.375) / (N + 0.25)); 1 for one rank."""
    if ranks <= 1 or cv <= 0:
        return 1.0
    return 1.0 + cv * NormalDist().inv_cdf((ranks - 0.375) / (ranks + 0.25))


@lru_cache(maxsize=8192)  # a pure function of its (hashable, frozen) arguments: a sweep asks for the same ones again
def gemm_time(
    g: Gemm, spec: KernelSpec, flops_per_s: float, mem_bytes_per_s: float, esize: int, out_esize: int = 0
) -> float:
    """Seconds of one GEMM (times its count): the better of the large tile and a 128×128 tile,
    each wave-quantized over the SMs, split-K when the tiles do not fill them; at least the
    time to stream its operands (`esize` bytes an element) and result (`out_esize`, 0: the
    operands') through HBM."""
    per_sm = flops_per_s / spec.sms
    best = math.inf
    for tm, tn, eff in (
        (spec.tile_m, spec.tile_n, 1.0),
        (spec.tile_n, spec.tile_m, 1.0),
        (128, 128, SMALL_TILE_EFFICIENCY),
    ):
        tiles = math.ceil(g.m / tm) * math.ceil(g.n / tn)
        split = 1
        if tiles < spec.sms:
            split = max(1, min(spec.sms // tiles, g.k // SPLIT_K_MIN))
        waves = math.ceil(tiles * split / spec.sms)
        t = waves * 2.0 * tm * tn * math.ceil(g.k / split) / (per_sm * eff)
        best = min(best, t)
    if out_esize:
        mem = ((g.m * g.k + g.k * g.n) * esize + g.m * g.n * out_esize) / mem_bytes_per_s
    else:
        mem = (g.m * g.k + g.k * g.n + g.m * g.n) * esize / mem_bytes_per_s
    return max(best, mem) * g.count


def attention_rate(spec: KernelSpec, a: Attention, bwd: bool, scale: float = 1.0) -> float:
    """FLOP/s of a fused attention pass: the long-sequence rate × s / (s + s_half), s the
    average key-loop length (half the sequence when causal), scaled down for small heads and
    by `scale` (the precision's peak over the half-precision tensor peak the figures are for)."""
    rate = (spec.attn_bwd_tflops if bwd else spec.attn_fwd_tflops) * 1e12 * scale
    half = spec.attn_bwd_half_seq if bwd else spec.attn_fwd_half_seq
    s = a.seq / 2 if a.causal else a.seq
    if a.head_dim <= ATTN_SMALL_HDIM:
        rate *= spec.attn_small_hdim_factor
    return rate * s / (s + half)


def attention_time(spec: KernelSpec, a: Attention, bwd: bool, scale: float = 1.0) -> float:
    work = a.fwd_flops * (BWD_ATTN_WORK if bwd else 1.0)
    return work / attention_rate(spec, a, bwd, scale)


def pass_time(
    kernel_s: list[float], other_bytes: float, other_kernels: int, spec: KernelSpec, mem_bytes_per_s: float
) -> float:
    """A pass's seconds in eager mode: the host issues one kernel every `kernel_floor_us`
    (launch + dispatch), the GPU runs them in order as they come, so a long kernel hides the
    issue of the next ones and a row of short ones waits on the host. The memory-bound bytes
    are split evenly over the other kernels, which are interleaved evenly with the GEMMs and
    attention (their order within a pass: a named simplification)."""
    floor = spec.kernel_floor_us * 1e-6
    each = other_bytes / mem_bytes_per_s / other_kernels if other_kernels > 0 else 0.0
    seq: list[float] = []
    n = len(kernel_s)
    placed = 0
    for i, k in enumerate(kernel_s):
        upto = round(other_kernels * (i + 1) / (n + 1))
        seq += [each] * (upto - placed)
        placed = upto
        seq.append(k)
    seq += [each] * (other_kernels - placed)
    if other_kernels == 0 and other_bytes > 0:
        seq.append(other_bytes / mem_bytes_per_s)
    gpu = 0.0
    for i, k in enumerate(seq):
        gpu = max(gpu, (i + 1) * floor) + k
    return gpu
