"""torch.compile of the transformer layers, as named assumptions: Inductor fuses the chains of
memory-bound ops into fewer kernels; GEMMs and attention are unchanged (cuBLAS and the SDPA
kernel, as in eager).

Bytes per token of a layer's forward, eager (`blocks._layer`) against compiled:
- each residual add (read 2h, write h) fuses with the norm after it (read h, write h): one
  kernel reads x and the branch output and writes the sum and the normed tensor, 4h against
  5h; the layer's last add fuses into the next layer's first norm (or the head's): two such
  kernels per layer, 8h against 10h;
- GELU: 2f either way (no GEMM epilogue fusion by default: its input comes from cuBLAS);
  SwiGLU: SiLU (2f) and the product (3f) fuse into one kernel reading gate and up, writing
  the product: 3f against 5f;
- rotary embeddings: one read and one write per rotated element against eager's ~10
  (`ROPE_EAGER_PASSES`; the cos / sin tables, shared by the batch, stay in cache: named).
Kernels: the two residual adds disappear as kernels of their own in forward (6 → 4), and their
gradients fuse into the norms' backward (`BWD_KERNELS_SAVED`). The per-kernel floor stays
eager's (Inductor's launches are assumed no cheaper: conservative, named). Embedding, head and
the mlp family's blocks are not changed (named).

Saved activations (`compiled_saves`): AOTAutograd's min-cut partitioner
(torch/_functorch/partitioners.py, `min_cut_rematerialization_partition`) saves what backward
needs at the smallest cut and recomputes cheap pointwise ops from it. Measured on CPU on the
runtime's own layer (experiments/readings/compile-saved.md, eager against compiled, fp32 and
bf16): a layer saves per RMSNorm its normalized input less (x * rstd: recomputed from the input
and rstd, both saved; the norm's output, a matmul's input, stays saved) and with SwiGLU the
SiLU's output less (recomputed from the gate's output, saved); LayerNorm (one op saving its input
and statistics) and GELU (its output a matmul's input) save the same as in eager. Not measured,
so left as in eager (named): the q/k norms, latent attention's norms, an MoE layer's experts.
"""

from __future__ import annotations

from dataclasses import replace

from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import kv_heads_per_rank
from shardsim.specs.model.workload import Workload

FWD_KERNELS_SAVED = 2  # the two residual adds, fused into the norms
BWD_KERNELS_SAVED = 4  # the two residual-gradient adds, and one kernel of each norm's backward
ROPE_EAGER_PASSES = 10  # as `blocks._layer` counts rotary embeddings in eager
ROPE_FUSED_PASSES = 2


def layer_mem_elems(a: Arch, tp: int = 1, sp: bool = False, compiled: bool = False) -> float:
    """Forward memory-bound elements per sample of one transformer layer, eager (what
    `blocks._layer` counts) or compiled."""
    h, f, s = a.hidden, a.ffn_size // tp, a.tokens
    sn = s // tp if sp and tp > 1 else s
    swiglu = a.traits.mlp == "swiglu"
    if compiled:
        mem = sn * 2 * 4 * h + s * (3 * f if swiglu else 2 * f)
    else:
        mem = sn * (2 * 2 * h + 2 * 3 * h) + s * (5 * f if swiglu else 2 * f)
    kvd = kv_heads_per_rank(a, tp) * a.head_dim if tp > 1 else a.kv_dim
    if a.position_kind == "rope":
        mem += (ROPE_FUSED_PASSES if compiled else ROPE_EAGER_PASSES) * s * (a.q_dim // tp + kvd)
    if a.qk_norm:  # read and written once, eager or fused
        mem += 2 * s * (a.q_dim // tp + kvd)
    return float(mem)


def compiled_share(a: Arch, tp: int = 1, sp: bool = False) -> float:
    """A layer's compiled memory-bound traffic over its eager traffic."""
    return layer_mem_elems(a, tp, sp, compiled=True) / layer_mem_elems(a, tp, sp)


def recomputed_elems(a: Arch, tp: int = 1, sp: bool = False, moe: bool = False) -> float:
    """Elements per sample a compiled transformer layer of one of `tp` ranks saves fewer than in
    eager (see the module's docstring): each of its two RMSNorms' normalized input (a tp-th of the
    tokens with sequence parallelism), and a dense SwiGLU's SiLU output."""
    sn = a.tokens // tp if sp and tp > 1 else a.tokens
    norms = 2 * sn * a.hidden if a.traits.norm == "rmsnorm" else 0
    silu = a.tokens * (a.ffn_size // tp) if a.traits.mlp == "swiglu" and not moe else 0
    return float(norms + silu)


def compiled_saves(w: Workload, compiled: bool) -> Workload:
    """`w` with what its transformer layers save for backward under torch.compile
    (`recomputed_elems` fewer each); `w` itself in eager or for a model without them."""
    a = w.arch
    if not compiled or a is None or not a.spec.transformer:
        return w
    fewer = {moe: recomputed_elems(a, w.tp, w.sequence_parallel, moe) for moe in (False, True)}
    blocks = tuple(
        replace(b, act_elems=b.act_elems - fewer[b.moe is not None]) if b.kind == "layer" else b for b in w.blocks
    )
    return replace(w, blocks=blocks)
