"""asyncTP as PyTorch runs it: inductor's micro-pipeline pass (torch/_inductor/fx_passes/
micro_pipeline_tp.py, on with torch._inductor.config._micro_pipeline_tp, which torchtitan sets
with torch.compile) rewrites sequence parallelism's all-gather -> matmul and matmul ->
reduce-scatter pairs into symmetric memory's fused ops (torch/distributed/_symmetric_memory).

Which pairs (`fused_pairs`): an all-gather whose output is the left operand of `aten.mm`s
(`_find_consumer_matmuls`: every such matmul joins, e.g. SwiGLU's gate and up), and a
reduce-scatter whose input an `aten.mm` wrote (`_find_producer_matmul`). As the runtime's modules
(`runtime.models.transformer`) trace, per transformer layer:
- forward: attention's input gathered into the fused q/k/v projection, its output projection
  reduce-scattered, the MLP's input gathered into its first matrices, its last reduce-scattered;
- backward: the MLP's and attention's output gradients gathered into the input gradients of
  their last matrices; attention's input gradient (one matmul through the fused q/k/v) reduce-
  scattered. SwiGLU's input gradient is the sum of gate's and up's: an add, not a matmul, wrote
  it, so its reduce-scatter stays a plain one. A weight gradient takes the gathered tensor
  transposed (not as its left operand): it runs after the fused op, on what it gathered.
- a biased Linear traces to `aten.addmm`, which neither pattern matches: a family with biases
  keeps its forward pairs plain (its backward's input gradients are plain matmuls: fused);
- the LM head's input gathered into its matmul, and its input gradient reduce-scattered; an
  MoE layer's MLP (router, grouped GEMMs) keeps its collectives plain (named).
Every other collective (the embedding's, the loss's, the norms' gradients, the router's) stays
as it is without asyncTP: after the block's compute.

How long a fused pair takes (`pair_s`), with tp ranks, chunks of M / tp rows (one per rank's
shard), each chunk's GEMMs costed on the GEMM model (`gpu_kernels.gemm_time`: tile quantization
and waves make the small chunks less efficient) and one chunk's transfer `c`:
- `fused_all_gather_matmul` (`_pipelined_all_gather_and_consume`): the local shard copied into
  the symmetric buffer (a device copy: read and write, at HBM bandwidth), then the local chunk's
  GEMMs, then each remote shard pulled by a copy and consumed, on two alternating streams whose
  copies do not overlap each other: first chunk + (tp - 1) x max(chunk GEMMs, chunk transfer);
- `fused_matmul_reduce_scatter` (`_pipelined_produce_and_all2all`): each remote rank's chunk
  produced, then pulled by its rank (double-buffered, two streams), the local chunk last, then
  the tp partial chunks summed (`reduce_partials`: tp chunks read, one written at HBM bandwidth):
  first chunk + (tp - 1) x max(chunk GEMMs, chunk transfer) + the sum.
Named choices: the GEMMs of chunks on the two streams run one after another, each at its own
quantized time (the computation/computation overlap PyTorch's comments say reduces quantization
is not credited: conservative); the barriers' latency is left out; a chunk's transfer is one
step of the group's ring all-gather of the whole tensor on the collective model (its time alone
over tp - 1: each step moves one shard per rank over its link, as each pull does; the copy
engine's rate is taken as NCCL's); the copy of the local shard into the gathered output runs
beside the last chunk's GEMMs (as PyTorch issues it) and is hidden. A pair's time replaces its
GEMMs' time in the block's pass (`AsyncTp.extra_s`: what the block's time changes by) and its
collective. Float8's scaled variants are costed at the precision's GEMM rate (named).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from shardsim.simulator import gpu_kernels as gk
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import kv_heads_per_rank
from shardsim.specs.model.workload import Block

AG, RS = "all_gather", "reduce_scatter"


@dataclass(frozen=True)
class FusedPair:
    """One collective fused with its matmuls: `coll` (all_gather: the matmuls consume what it
    gathers; reduce_scatter: the matmul produces what it scatters); `whole`: the GEMMs the block's
    time counts for them (`gpu_kernels.block_kernels`' shapes, per sample's tokens); `matmuls`: the
    `aten.mm`s PyTorch runs on the whole M rows (each chunk runs them on M / tp)."""

    coll: str
    whole: tuple[gk.Gemm, ...]
    matmuls: tuple[gk.Gemm, ...]

    def chunk(self, tp: int) -> tuple[gk.Gemm, ...]:
        """One chunk's GEMMs: M / tp rows of each matmul."""
        return tuple(gk.Gemm(g.m // tp, g.n, g.k, g.count) for g in self.matmuls)


def fused_pairs(a: Arch, b: Block, tp: int, tokens: int) -> dict[str, FusedPair]:
    """The pairs the micro-pipeline pass fuses in block `b` of a model of `a` on one of `tp`
    ranks, for `tokens` rows (a micro-batch's tokens, gathered), by the tensor-parallel call's
    `what` (`tensor_parallel.block_calls`); see the module's docstring."""
    h, t = a.hidden, tokens
    biased = a.traits.bias
    if b.kind == "head" and a.traits.tokens == "text" and a.spec.head == "lm" and not b.tokens:
        v = -(-a.vocab // tp)
        return {
            "head in": FusedPair(AG, (gk.Gemm(t, v, h),), (gk.Gemm(t, v, h),)),
            "head in grad": FusedPair(RS, (gk.Gemm(t, h, v),), (gk.Gemm(t, h, v),)),
        }
    if b.kind != "layer" or not a.spec.transformer or a.mla:
        return {}
    kvd = kv_heads_per_rank(a, tp) * a.head_dim
    hq = a.q_dim // tp
    qkv, proj = gk.Gemm(t, hq + 2 * kvd, h), gk.Gemm(t, h, hq)
    out: dict[str, FusedPair] = {
        "attn out grad": FusedPair(AG, (gk.Gemm(t, hq, h),), (gk.Gemm(t, hq, h),)),
        "attn in grad": FusedPair(RS, (gk.Gemm(t, h, hq + 2 * kvd),), (gk.Gemm(t, h, hq + 2 * kvd),)),
    }
    if not (biased or a.qkv_bias):
        out["attn in"] = FusedPair(AG, (qkv,), (qkv,))
    if not biased:
        out["attn out"] = FusedPair(RS, (proj,), (proj,))
    if b.moe is not None:
        return out
    f = a.ffn_size // tp
    down = gk.Gemm(t, h, f)
    out["mlp out grad"] = FusedPair(AG, (gk.Gemm(t, f, h),), (gk.Gemm(t, f, h),))
    if a.traits.mlp == "swiglu":
        first: tuple[gk.Gemm, ...] = (gk.Gemm(t, 2 * f, h),)  # the GEMM model's gate and up as one
        mms = (gk.Gemm(t, f, h), gk.Gemm(t, f, h))  # the runtime's gate and up: two matmuls
    else:
        first = mms = (gk.Gemm(t, f, h),)
        out["mlp in grad"] = FusedPair(RS, (gk.Gemm(t, h, f),), (gk.Gemm(t, h, f),))
    if not biased:
        out["mlp in"] = FusedPair(AG, first, mms)
        out["mlp out"] = FusedPair(RS, (down,), (down,))
    return out


def pair_s(chunk_s: float, transfer_s: float, tp: int, edge_s: float) -> float:
    """Seconds of a fused pair of `tp` chunks, each chunk's GEMMs `chunk_s` and transfer
    `transfer_s`; `edge_s` the all-gather's copy of its shard into the symmetric buffer before,
    or the reduce-scatter's sum of the partial chunks after (see the module's docstring)."""
    return edge_s + chunk_s + (tp - 1) * max(chunk_s, transfer_s)


@dataclass
class AsyncTp:
    """The fused pairs' time of a plan's tensor parallelism (tp ranks, compute model `cm`: its
    GEMM figures and HBM bandwidth), `alone_s` a collective's seconds alone on the network."""

    cm: ComputeModel
    tp: int
    alone_s: Callable[[str, GroupLayout, float], float]
    _memo: dict[tuple, float] = field(default_factory=dict)
    _pairs: dict[tuple, dict[str, FusedPair]] = field(default_factory=dict)

    def pairs(self, b: Block, mb: int) -> dict[str, FusedPair]:
        """Block `b`'s fused pairs at micro-batch `mb` (`fused_pairs`), once per what decides them."""
        key = (b.kind, b.moe is not None, b.tokens, mb)
        out = self._pairs.get(key)
        if out is None:
            a = self.cm.arch
            assert a is not None, "asyncTP plans the per-rank workload of an Arch"
            out = self._pairs[key] = fused_pairs(a, b, self.tp, mb * a.tokens)
        return out

    def extra_s(self, what: str, pair: FusedPair, layout: GroupLayout, nbytes: float) -> float:
        """What the fused pair of call `what` (`nbytes`, the whole gathered or scattered tensor)
        adds to its block's pass over the GEMMs the pass counts for it (can be negative)."""
        key = (what, pair, layout, nbytes)
        out = self._memo.get(key)
        if out is None:
            tp = self.tp
            chunk = sum(self.cm.gemm_s(g) for g in pair.chunk(tp))
            transfer = self.alone_s(AG, layout, nbytes) / (tp - 1)
            shard = nbytes / tp
            hbm = self.cm.mem_bytes_per_s
            edge = 2 * shard / hbm if pair.coll == AG else (tp + 1) * shard / hbm
            whole = sum(self.cm.gemm_s(g) for g in pair.whole)
            out = self._memo[key] = pair_s(chunk, transfer, tp, edge) - whole
        return out
