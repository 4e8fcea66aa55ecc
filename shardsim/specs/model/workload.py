"""Workloads: a model as an ordered list of blocks (the units FSDP wraps and pipelines split).

A described model (`Arch`) is costed analytically (`specs.model.blocks`), without torch; a
model given by import path (``pkg.module:build_fn``) is measured on the meta device instead
(`workload.measure`, which imports torch). Both produce the same `Workload`; a test checks
that the analytic numbers equal what torch measures on the runtime's own modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from shardsim.specs.model.arch import Arch


@dataclass(frozen=True)
class MoELayer:
    """The mixture-of-experts MLP of a layer as one rank holds it (all experts: expert parallelism
    of 1), per sample: what its kernels and an expert-parallel plan need, expert by expert."""

    experts: int
    top_k: int
    hidden: int
    expert_ffn: int  # one routed expert's inner size on this rank (a tp-th with tensor parallelism)
    shared_ffn: int  # the shared expert's inner size on this rank; 0: none
    tokens: int  # tokens per sample the router sees
    shared_gate: bool = False
    split: int = 1  # ranks the routed tokens are split over before dispatch (EP borrowing tp ranks: tp)

    @property
    def routed_rows(self) -> int:
        """Token copies per sample this rank sends to experts (its tokens x top_k): the grouped GEMMs' rows."""
        return self.tokens // self.split * self.top_k

    @property
    def mean_rows(self) -> float:
        """Rows one expert receives per sample when the router spreads them evenly."""
        return self.routed_rows / self.experts

    def busiest_rows(self, imbalance: float) -> float:
        """Rows per sample of the busiest expert: `imbalance` (its tokens over the mean) x the mean."""
        return imbalance * self.mean_rows

    @property
    def dispatch_elems_per_token(self) -> int:
        """Elements one routed copy of a token carries to its expert (and back): the hidden size."""
        return self.hidden

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert on this rank (w1, w3: hidden x expert_ffn; w2 back)."""
        return 3 * self.hidden * self.expert_ffn


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
    # the part of act_elems that matmuls and the attention kernel wrote: what op-level selective
    # checkpointing keeps (the rest is recomputed)
    act_matmul_elems: float = 0.0
    # parameter tensors the block holds (what per-parameter Adam launches its kernels for)
    param_tensors: int = 0
    # elements of its largest parameter tensor (0: not known, as for a measured model); what
    # ZeroRedundancyOptimizer's partition of whole tensors cannot split (`strategies.zero1`)
    largest_tensor: int = 0
    # tokens per sample the block computes on, 0: the model's (a masked-LM head: its masked positions)
    tokens: int = 0
    # of `params`, those a tensor-parallel rank holds as DTensors (a parallel style's sharded or
    # replicated parameters; the rest stay plain tensors): under TP + DDP their gradients are
    # ready only at the end of backward (`strategies.ddp.grad_ready_bytes`); 0 without TP
    dtensor_params: int = 0
    # of `params`, those a token does not use: the routed experts it is not sent to (an MoE layer's
    # experts - top_k of them); 0 for a dense block
    inactive_params: int = 0
    moe: MoELayer | None = None  # the block's mixture-of-experts MLP, if it has one

    @property
    def active_params(self) -> int:
        """Parameters one token uses (all of them but the routed experts it is not sent to)."""
        return self.params - self.inactive_params


@dataclass(frozen=True)
class Workload:
    name: str
    blocks: tuple[Block, ...]
    tokens_per_sample: int = 1
    arch: Arch | None = None
    import_path: str | None = None
    notes: dict[str, str] = field(default_factory=dict, compare=False)
    tp: int = 1  # the blocks are one of `tp` tensor-parallel ranks' (`blocks.from_arch`)
    sequence_parallel: bool = False

    @property
    def tied_embeddings(self) -> bool:
        """The LM head reuses the token embedding (a pipeline of it is refused: `resolve`)."""
        return bool(self.arch and self.arch.tied_embeddings)

    @cached_property  # the blocks are fixed; a sweep asks for these of one workload for every configuration
    def params(self) -> int:
        return sum(b.params for b in self.blocks)

    @property
    def active_params(self) -> int:
        """Parameters one token uses: `params` less the routed experts it is not sent to."""
        return sum(b.active_params for b in self.blocks)

    @property
    def moe(self) -> bool:
        """Whether any block holds a mixture of experts."""
        return any(b.moe is not None for b in self.blocks)

    @cached_property
    def layers(self) -> tuple[Block, ...]:
        return tuple(b for b in self.blocks if b.kind == "layer")

    @property
    def fwd_flops(self) -> float:
        return sum(b.fwd_flops for b in self.blocks)

    @property
    def train_flops(self) -> float:
        return sum(b.fwd_flops + b.bwd_flops for b in self.blocks)


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
