"""The attention implementations a run may choose (PyTorch's SDPA backends), as the kernel model
costs them; `flash` is the fused model of `gpu_kernels` (the default, unchanged).

- efficient (SDPBackend.EFFICIENT_ATTENTION: xformers' CUTLASS memory-efficient kernel): the
  fused kernel's work at `EFFICIENT_RATE` of FlashAttention-2's rates. Source (kernel level):
  the FlashAttention-2 paper (Dao 2023, arXiv 2307.08691) puts FlashAttention at 25-40 % of
  A100's peak and FlashAttention-2 at 50-73 % (abstract), and its A100 kernel benchmarks
  (Figure 4) show xformers' kernel near FlashAttention's; midpoints 32.5 / 61.5 = 0.53. The
  same share assumed in forward and backward and on every GPU (named). It saves what flash
  saves (the output and its log-sum-exp).
- math (SDPBackend.MATH, unfused, as `aten::_scaled_dot_product_attention_math` runs, its ops
  listed by torch.profiler on torch 2.13): in fp32 whatever the training precision (PyTorch
  upcasts fp16 / bf16 inputs of the math backend unless
  ``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)``; default False, and the
  saved tensors of a bf16 call are fp32 on torch 2.13); per head QK^T and PV as two batched
  GEMMs at the kernel model's GEMM efficiency at the fp32 rate (TF32's under tf32) (the whole
  S x S, causal or not: the mask is added, not skipped); the fp32 score tensor (batch x heads
  x S x S) read and written by memory-bound kernels at the achieved HBM bandwidth: forward
  the mask's add (causal only: read, write) and the softmax (read, write); backward the
  softmax's backward (read dP and P, write dS):
  `SCORE_FWD_PASSES`, `SCORE_BWD_PASSES`; backward's four GEMMs dP = dO V^T, dV = P^T dO,
  dQ = dS K, dK = dS^T Q. Saved for backward beyond the fused kernels (`saved_extra_bytes`):
  the fp32 softmax output P (heads x S x S per sample) less the log-sum-exp (heads x S) it does
  not keep, and under fp16 / bf16 the fp32 copies of q, k and v in place of their half-precision
  ones; what saved_tensors_hooks count for a gpt or bert layer under MATH against the default
  kernel on CPU (torch 2.13), exactly, in fp32 and bf16 (a test checks it). Grouped-query
  attention's key/value expansion (a copy) is not counted (named).
"""

from __future__ import annotations

from shardsim.simulator.gpu_kernels import Attention, Gemm

EFFICIENT_RATE = 0.53  # memory-efficient SDPA's throughput over flash's (see above)
SCORE_FWD_PASSES = 2  # softmax: read + write of each score element
CAUSAL_MASK_PASSES = 2  # the causal mask's add: read + write (the S x S mask itself, shared, not counted)
SCORE_BWD_PASSES = 3  # softmax backward: read dP and P, write dS


def math_gemms(a: Attention) -> tuple[tuple[Gemm, ...], tuple[Gemm, ...]]:
    """The unfused path's GEMMs (forward, backward), the heads stacked along m: QK^T is
    [bh*s x s] over d, PV [bh*s x d] over s; backward dP (as QK^T), dV, dQ, dK (as PV)."""
    bh, s, d = a.batch_heads, a.seq, a.head_dim
    scores = Gemm(bh * s, s, d)
    values = Gemm(bh * s, d, s)
    return (scores, values), (scores, values, values, values)


def score_elems(a: Attention) -> float:
    """Elements of the score tensor of one call: batch x heads x S x S."""
    return float(a.batch_heads) * a.seq * a.seq


def math_mem_elems(a: Attention) -> tuple[float, float]:
    """Elements the unfused path's memory-bound kernels read and write over the scores (forward, backward)."""
    e = score_elems(a)
    fwd = e * (SCORE_FWD_PASSES + (CAUSAL_MASK_PASSES if a.causal else 0))
    return fwd, e * SCORE_BWD_PASSES


def math_flops(a: Attention) -> tuple[float, float]:
    """FLOPs the unfused path executes (forward, backward): the full S x S, twice the causal
    kernel's work; backward four GEMMs of the forward's two."""
    full = 4.0 * a.batch_heads * a.seq * a.seq * a.head_dim
    return full, 2 * full


SCORE_BYTES = 4  # the math path's scores and copies: fp32


def saved_extra_bytes(heads: int, seq: int, qkv_width: int, esize: int) -> float:
    """Bytes per sample the unfused path saves beyond the fused kernels: fp32 P (heads x S x S)
    less the fp32 log-sum-exp (heads x S); with inputs of `esize` < 4 bytes, fp32 copies of
    q, k, v (`qkv_width` per token) in place of theirs."""
    p = SCORE_BYTES * float(heads) * seq * (seq - 1)
    return p + max(0, SCORE_BYTES - esize) * seq * qkv_width
