"""The attention implementations a run may choose (PyTorch's SDPA backends, or eager attention
without SDPA), as the kernel model costs them; `flash` is the fused model of `gpu_kernels` (the
default, unchanged); and the warning where a choice runs slower than its precision suggests.

- efficient (SDPBackend.EFFICIENT_ATTENTION: xformers' CUTLASS memory-efficient kernel): the
  fused kernel's work at `EFFICIENT_RATE` of FlashAttention-2's rates. Source (kernel level):
  the FlashAttention-2 paper (Dao 2023, arXiv 2307.08691) puts FlashAttention at 25-40 % of
  A100's peak and FlashAttention-2 at 50-73 % (abstract), and its A100 kernel benchmarks
  (Figure 4) show xformers' kernel near FlashAttention's; midpoints 32.5 / 61.5 = 0.53. The
  same share assumed in forward and backward and on every GPU (named). It saves what flash
  saves (the output and its log-sum-exp).
- cudnn (SDPBackend.CUDNN_ATTENTION: cuDNN's fused flash-attention graph, what PyTorch prefers
  on sm90 / sm100 with cuDNN > 9.15, `check_prefer_cudnn_attention` in sdp_utils.cpp): the fused
  kernel's work at `CUDNN_RATES` of FlashAttention-2's rates, by the GPU's compute capability
  (forward, backward). Sources (kernel level): H100 / H200 (sm90) the FlashAttention-3 paper
  (Shah et al. 2024, arXiv 2407.08608), Figures 5 and 6, BF16 on H100 SXM5, head dim 128,
  sequences 2k-8k: forward causal 484 / 298, 518 / 319, 529 / 333 TFLOP/s (cuDNN / FA2; 1.62,
  1.62, 1.59), non-causal 617 / 362, 609 / 368, 600 / 370 (1.70, 1.65, 1.62), backward 465 /
  291, 499 / 310, 518 / 318 (1.60, 1.61, 1.63): 1.61 each way (H200 taken as H100's die);
  A100 (sm80) 0.82, A10G (sm86) 0.93, L40S (sm89) 1.00: Hugging Face Transformers PR 48163's
  training-shape benchmark of the two SDPA backends (the same share forward and backward,
  named). It saves what flash saves (the output and its softmax statistics). Refused where
  PyTorch's `can_use_cudnn_attention` refuses it for every call (`cudnn_refusal`): a GPU outside
  [sm80, sm121] (`check_cudnn_hardware_support`), inputs other than fp16 / bf16
  (`check_dtypes_low_precision` on sm80+), a head dim above 128 (256 on sm90 / sm100,
  `check_cudnn_tensor_shapes` with cuDNN > 9.22; backward there takes <= 128 or 256,
  `check_cudnn_d256_bprop_head_dim`) or not a multiple of 8.
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
- eager (no SDPA: Hugging Face Transformers' ``eager_attention_forward``, the runtime's
  `eager_attention`): QK^T and PV as two batched GEMMs in the training precision at the kernel
  model's GEMM rate for it (the tensor cores' in fp16 / bf16, TF32's under tf32: plain matmuls,
  which allow_tf32 governs), over the whole S x S as math's (`math_gemms`, `math_flops`). The
  score tensor's elementwise kernels, each its own pass over b x h x S x S at the achieved HBM
  bandwidth, bytes per element from the dtypes they read and write (`eager_fwd_kernels`,
  `eager_bwd_kernels`; e the precision's bytes): forward the scale's multiply (e + e), the causal
  mask's add (e + e; the S x S mask, shared over the batch and heads, not counted), the softmax
  in fp32 (``softmax(dtype=float32)``; PyTorch's SoftMax.cpp: for fp16 on CUDA one
  half-to-float kernel, e + 4; for bf16 a cast to fp32, e + 4, then the fp32 softmax, 4 + 4;
  fp32 4 + 4) and the cast back (4 + e, none in fp32); backward the cast's (e + 4), the
  softmax's backward (read dP and P in fp32, write dS: 4 + 4 + e for fp16's half-to-float
  kernel, 4 + 4 + 4 then the cast's backward 4 + e for bf16) and the scale's (e + e). No
  dropout: the families have no attention dropout. Saved for backward beyond the fused kernels
  (`eager_saved_extra_bytes`): the fp32 softmax output and, in fp16 / bf16, its cast (the PV
  matmul's input), less the log-sum-exp: what saved_tensors_hooks count on a gpt or bert layer,
  exactly (a test). With rotary positions the fused kernel's saved v holds the whole qkv
  projection's output, which eager's copies of q, k and v release (not counted, named), and
  grouped-query attention's repeat of k and v is not counted either (as math's).
  Megatron's fused scale-mask-softmax (one kernel, e + e forward, 3e backward) and BERT's
  half-precision softmax move fewer bytes: Transformers' eager is what is costed (named).
"""

from __future__ import annotations

from collections.abc import Iterable

from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError
from shardsim.core.notes import warn
from shardsim.simulator.gpu_kernels import Attention, Gemm
from shardsim.simulator.network.nccl_runs import compute_capability
from shardsim.specs.model.arch import Arch

EFFICIENT_RATE = 0.53  # memory-efficient SDPA's throughput over flash's (see above)
# cuDNN SDPA's throughput over FlashAttention-2's (forward, backward) by compute capability x10 (see above)
CUDNN_RATES: dict[int, tuple[float, float]] = {
    90: (1.61, 1.61),  # H100, H200: FlashAttention-3 paper, Figures 5 and 6 (head dim 128, 2k-8k tokens)
    89: (1.00, 1.00),  # L40S: Transformers PR 48163 (a wash)
    86: (0.93, 0.93),  # A10G: Transformers PR 48163
    80: (0.82, 0.82),  # A100: Transformers PR 48163
}
CUDNN_SM = (80, 121)  # check_cudnn_hardware_support: [sm80, sm121]
CUDNN_PRECISIONS = ("fp16", "bf16")  # check_dtypes_low_precision on sm80+
CUDNN_HEAD_DIMS = {90: (128, 256), 100: (128, 256)}  # head dims backward takes, sm90 / sm100 (else <= 128)
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


SCORE_BYTES = 4  # the math path's scores and copies: fp32; eager's softmax output


def _esize(precision: str) -> int:
    """Bytes of an element stored in `precision` (tf32 stores fp32)."""
    return SCORE_BYTES if precision in ("fp32", "tf32") else 2


def eager_fwd_kernels(causal: bool, precision: str) -> tuple[int, ...]:
    """Bytes per score element of each of eager's forward elementwise kernels in `precision`, in
    order: the scale's multiply, the causal mask's add, the fp32 softmax (bf16: its cast to fp32
    first), the cast back (see above)."""
    e, f = _esize(precision), SCORE_BYTES
    softmax = {"fp16": (e + f,), "bf16": (e + f, 2 * f)}.get(precision, (2 * f,))
    return (2 * e, *((2 * e,) if causal else ()), *softmax, *((f + e,) if e < f else ()))


def eager_bwd_kernels(precision: str) -> tuple[int, ...]:
    """Bytes per score element of each of eager's backward elementwise kernels in `precision`, in
    order: the cast's backward, the softmax's backward (dP and P read in fp32, dS written; bf16:
    then dS's cast) and the scale's."""
    e, f = _esize(precision), SCORE_BYTES
    softmax = {"fp16": (2 * f + e,), "bf16": (3 * f, f + e)}.get(precision, (3 * f,))
    return (*((e + f,) if e < f else ()), *softmax, 2 * e)


def eager_saved_extra_bytes(heads: int, seq: int, esize: int) -> float:
    """Bytes per sample eager saves beyond the fused kernels: the fp32 softmax output (heads x S
    x S) less the fp32 log-sum-exp (heads x S), and with inputs of `esize` < 4 bytes its cast
    (PV's input)."""
    half = esize * float(heads) * seq * seq if esize < SCORE_BYTES else 0.0
    return SCORE_BYTES * float(heads) * seq * (seq - 1) + half


def saved_extra_bytes(heads: int, seq: int, qkv_width: int, esize: int) -> float:
    """Bytes per sample the unfused path saves beyond the fused kernels: fp32 P (heads x S x S)
    less the fp32 log-sum-exp (heads x S); with inputs of `esize` < 4 bytes, fp32 copies of
    q, k, v (`qkv_width` per token) in place of theirs."""
    p = SCORE_BYTES * float(heads) * seq * (seq - 1)
    return p + max(0, SCORE_BYTES - esize) * seq * qkv_width


def cudnn_rates(model: str) -> tuple[float, float]:
    """cuDNN SDPA's (forward, backward) rates over flash's on GPU `model` (`cudnn_refusal` has
    refused a GPU without them)."""
    return CUDNN_RATES[compute_capability(model)]


def cudnn_refusal(model: str, precision: str, head_dim: int | None) -> ConfigError | None:
    """Why PyTorch's cuDNN SDPA cannot run a training step's attention of `head_dim` (None: not
    known) in `precision` on GPU `model` (see above), naming the field to change; else None."""
    cc = compute_capability(model)
    if not CUDNN_SM[0] <= cc <= CUDNN_SM[1] or cc not in CUDNN_RATES:
        why = f"cuDNN attention needs a GPU of sm80 to sm121 (A100, H100, H200), not {model}"
        return ConfigError(why, field="attention")
    if precision not in CUDNN_PRECISIONS:
        why = f"cuDNN attention takes fp16 or bf16 inputs, not {precision} (flash and efficient take fp32)"
        return ConfigError(why, field="precision")
    limit = CUDNN_HEAD_DIMS.get(cc, (128,))
    if head_dim is not None and (head_dim % 8 or not (head_dim <= limit[0] or head_dim in limit)):
        allowed = " or ".join(["a multiple of 8 up to 128", *map(str, limit[1:])])
        return ConfigError(f"cuDNN attention on {model} takes a head dim {allowed}, not {head_dim}", field="attention")
    return None


def check_attention(cfg: RunConfig, model: str, arch: Arch | None) -> None:
    """Refuse, in one line, cudnn where PyTorch cannot run it (`cudnn_refusal`) on GPU `model`
    for a model of `arch` (None: its head dim unknown)."""
    if cfg.attention == "cudnn" and (err := cudnn_refusal(model, cfg.precision, arch and arch.head_dim)):
        raise err


def slower_rate_warning(attention: str, precision: str) -> str | None:
    """The line to warn with where `attention` runs slower than `precision` suggests, else None:
    the fused kernels under tf32 compute in fp32 at fp32's rate (``allow_tf32`` governs matmuls,
    not SDPA's kernels: `compute.ComputeModel._attention_scale`); math upcasts fp16 / bf16 inputs
    to fp32 (see above). In fp32 every choice runs at the rate fp32 suggests."""
    if attention in ("flash", "efficient") and precision == "tf32":
        return (
            f"attention {attention} under tf32 runs at the fp32 rate, not TF32's: PyTorch's fused SDPA kernels "
            "compute fp32 inputs in fp32 whatever allow_tf32 says (eager's matmuls run on the TF32 tensor cores; "
            "bf16 runs the fused kernels on them)"
        )
    if attention == "math" and precision in ("fp16", "bf16"):
        return (
            f"attention math under {precision} runs in fp32: PyTorch's math SDPA upcasts {precision} inputs (its "
            f"GEMMs at the fp32 rate, the scores in fp32); eager runs them in {precision}"
        )
    return None


def warn_slower_rates(choices: Iterable[tuple[str, str]]) -> None:
    """Warn on stderr, once each, for the (attention, precision) pairs that run slower than
    their precision suggests (`slower_rate_warning`)."""
    for attention, precision in dict.fromkeys(choices):
        if (line := slower_rate_warning(attention, precision)) is not None:
            warn(line)
