"""Tokens and dollars of a step: model FLOPs (the MFU convention), tokens/s per GPU, $ per step,
per million samples and per million tokens; and the error the model states for its predictions.

MFU counts *model* FLOPs, the convention of PaLM (Chowdhery et al. 2022, appendix B) and
torchtitan: 3 × the forward's FLOPs (backward twice the forward), whatever the step really
computes (recomputation under checkpointing, the fused attention kernels' recomputation of
QK^T in backward not counted). Per token of a causal text model that is

    6·N + 6·L·d·S    (bidirectional: 6·N + 12·L·d·S)

N the parameters that multiply (every matrix, the LM head's included, the embedding lookups
not; of a mixture of experts the active ones: of its routed experts the top_k a token goes to),
L layers, d the hidden size, S the sequence length: the forward's attention is 2·S·d per token
and layer for QK^T and PV, halved for a causal model (the masked half is not computed).
The peak it is divided by is the dense peak (`peak_tflops`, no sparsity) of the tensor cores
at the precision they run (`mfu_peak`): bf16's, fp16's or tf32's; for fp32 on a device with 16-bit
tensor cores theirs (bf16's, else fp16's), since fp32 matmuls leave them idle and fp32's own,
lower peak would flatter the slower precision; fp32's only where the device has nothing else (a CPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardsim.specs.model.workload import Workload

# The model's stated error: the mean absolute error of step-time predictions on its calibration
# set, out of sample (5-fold cross-validation: 78 measured FSDP runs of MPT models, 125M-70B, on
# A100-40GB; experiments/calibration/README.md, "5-fold CV" row, 4.4 %). A margin between two
# configurations below it is not a margin until measured (a named simplification: the errors of
# two configurations of one cluster are correlated, so their ratio errs less than either, and
# another GPU or software stack errs more: docs/simulator.md).
MODEL_ERROR = 0.044
MODEL_ERROR_SOURCE = "experiments/calibration/README.md (5-fold CV mean absolute error)"

MFU_FORMULA = {True: "6·N + 6·L·d·S", False: "6·N + 12·L·d·S"}  # FLOPs per token, causal or not


TENSOR_CORE_PRECISIONS = ("bf16", "fp16")  # what fp32's MFU is taken against, the first the device has


def mfu_peak(peak_tflops: Mapping[str, float], precision: str) -> tuple[str, float]:
    """The precision whose dense peak MFU is taken against, and that peak in TFLOP/s: the
    precision's own, but fp32's is the device's 16-bit tensor cores' (`TENSOR_CORE_PRECISIONS`)
    where it has them."""
    if precision == "fp32":
        for p in TENSOR_CORE_PRECISIONS:
            if p in peak_tflops:
                return p, peak_tflops[p]
    return precision, peak_tflops[precision]


def model_flops_per_sample(w: Workload) -> float:
    """Model FLOPs of one sample's forward and backward: 3 × the forward's (`specs.model.blocks`
    counts the forward: 2 per multiply-add, causal attention as half the s×s products)."""
    return 3.0 * w.fwd_flops


def sequence_length(w: Workload) -> int | None:
    """Tokens per sample of a sequence (text) model; None for other models (images, vectors,
    a model given by import path)."""
    if w.arch is None or w.arch.traits.tokens != "text":
        return None
    return w.arch.tokens


def mfu_formula(w: Workload) -> str:
    """The model-FLOP count MFU uses, as text: per token for text models, else 3 × forward."""
    if sequence_length(w) is None:
        return "3 x forward per sample"
    assert w.arch is not None
    formula = MFU_FORMULA[w.arch.traits.causal]
    if w.moe:  # N the parameters a token uses (its top_k routed experts, not all of them)
        formula = formula.replace("N", "N_active", 1)
    return f"{formula} per token"


@dataclass(frozen=True)
class StepEconomics:
    """What a step yields and costs. None where it does not apply (no sequence, no price) and
    NaN where the step was not simulated."""

    seq_len: int | None
    tokens_per_s_per_gpu: float | None
    cost_per_step_usd: float | None
    cost_per_million_samples_usd: float | None
    cost_per_million_tokens_usd: float | None


def economics(
    step_s: float, global_batch: int, world: int, seq_len: int | None, price_per_hour: float | None
) -> StepEconomics:
    """Tokens and dollars of a step of `step_s` seconds that trains `global_batch` samples of
    `seq_len` tokens on `world` devices of a cluster priced `price_per_hour` (the topology's
    price × nodes, on-demand): $ per step = price × step / 3600; per million samples (tokens) =
    $ per step / samples (tokens) a step × 10^6."""
    tokens = None if seq_len is None else global_batch * seq_len
    rate = None if tokens is None else (tokens / step_s / world if step_s > 0 else float("nan"))
    per_step = None if price_per_hour is None else price_per_hour * step_s / 3600.0
    per_m_samples = None if per_step is None else per_step / global_batch * 1e6
    per_m_tokens = None if per_step is None or tokens is None else per_step / tokens * 1e6
    return StepEconomics(seq_len, rate, per_step, per_m_samples, per_m_tokens)
