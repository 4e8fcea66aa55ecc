"""The optimizers' state and step, per parameter a rank owns: fp32 words of state, words the
step reads and writes, full-size temporaries, and per-tensor launches of the per-parameter loop.

The step is memory-bound: its time is its traffic at the achieved HBM bandwidth
(`compute.ComputeModel.optimizer`). Traffic is counted as the fewest passes the update needs
(reads + writes of fp32 words per parameter; a named convention, as Adam's has been: foreach's
extra passes over its temporaries are not counted):
- adam, adamw: read param, grad, m, v; write param, m, v: 7 (AdamW's decoupled decay folds
  into the parameter's write).
- sgd (momentum 0.9, torch.optim.SGD): read param, grad, buffer; write param, buffer: 5.
- lamb (You et al. 2019; apex FusedLAMB, DeepSpeed): Adam's pass writing the update too
  (read p, g, m, v; write m, v, u: 7), the trust ratio's two norms (read p, u: 2), the
  scaled update (read p, u; write p: 3): 12.
- adafactor (torch.optim.Adafactor, no first moment): the factored statistics read the
  gradient (1), the update reads param and gradient and writes the param (3): 4.
State (fp32 words per parameter): adam, adamw, lamb 2 (m, v); sgd 1 (its momentum buffer;
none without momentum, which this setting does not offer); adafactor's factored second
moment: a matrix R x C keeps R + C (its row and column means), a vector n keeps n, so
words = (sum over matrices of R + C + the vectors' elements) / parameters (`adafactor_words`):
about 0 for large matrices (3.8e-4 for llama-2-7b).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsim.specs.model.arch import Arch


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer's per-parameter figures (fp32 words)."""

    state_words: float  # kept between steps (adafactor's: `adafactor_words` of the model)
    step_words: int  # read + written by one step
    ops_per_tensor: int  # elementwise ops the per-parameter loop launches for each parameter tensor
    # full-size fp32 temporaries alive during the step, by implementation (foreach | fused | per-parameter)
    temporaries: dict[str, float]


# torch.optim.Adam(foreach=True) materializes sqrt(exp_avg_sq) for all of a rank's parameters at
# once (one word); fused=True and the per-parameter loop keep none the size of the parameters.
# SGD's foreach path updates its buffers and parameters in place (none). LAMB's update u is
# materialized before its norm whatever the implementation (one). Adafactor's foreach path holds
# the variance estimate (row x col outer product) of every parameter at once (one).
OPTIMIZERS: dict[str, OptimizerSpec] = {
    "adam": OptimizerSpec(2, 7, 10, {"foreach": 1.0, "fused": 0.0, "per-parameter": 0.0}),
    "adamw": OptimizerSpec(2, 7, 11, {"foreach": 1.0, "fused": 0.0, "per-parameter": 0.0}),
    "sgd": OptimizerSpec(1, 5, 3, {"foreach": 0.0, "fused": 0.0, "per-parameter": 0.0}),
    "lamb": OptimizerSpec(2, 12, 14, {"foreach": 1.0, "fused": 1.0, "per-parameter": 1.0}),
    "adafactor": OptimizerSpec(0, 4, 12, {"foreach": 1.0, "fused": 1.0, "per-parameter": 0.0}),
}
# per-parameter ops: Adam's 10 (lerp, mul, addcmul, sqrt, div, add, addcdiv, step +1, two bias
# corrections), AdamW's decay (+1), SGD's mul, add, add; LAMB Adam's with two norms and a
# division (+4); Adafactor's row and column means, their lerps, the outer product, rsqrt, the
# update and its clamp (about 12; assumption, named).


def spec(name: str) -> OptimizerSpec:
    return OPTIMIZERS[name]


def _matrices(a: Arch) -> list[tuple[int, int]]:
    """The model's weight matrices as (rows, cols), each counted once (a tied head not again)."""
    h, f = a.hidden, a.ffn_size
    if not a.spec.transformer:
        return [(f, h), (h, f)] * a.layers + [(a.classes, h)]
    layer = [(a.q_dim + 2 * a.kv_dim, h), (h, a.q_dim), (h, f)]
    layer += [(f, h)] * (2 if a.traits.mlp == "swiglu" else 1)
    mats = layer * a.layers
    if a.spec.embed == "patches":
        mats += [(h, a.channels * a.patch * a.patch), (a.tokens, h), (a.classes, h)]
    else:
        mats.append((a.vocab, h))
        if a.position_kind == "learned":
            mats.append((a.tokens, h))
        if not a.tied_embeddings:
            mats.append((a.vocab, h))
    return mats


def adafactor_words(a: Arch | None, params: int) -> float:
    """Adafactor's state words per parameter of a model of `a` with `params` parameters: each
    matrix R x C keeps R + C, every other parameter (biases, norms) one each. A convolution's
    weight is counted as the matrix (out, in x k x k) (torch factors its last two dimensions:
    a small difference, named). Without an Arch (a model by import path): 0, its vectors
    not counted (named)."""
    if a is None or params <= 0:
        return 0.0
    mats = _matrices(a)
    in_mats = sum(r * c for r, c in mats)
    return (sum(r + c for r, c in mats) + max(0, params - in_mats)) / params
