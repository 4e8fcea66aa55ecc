"""Tensor parallelism's collectives in a step's plan: what each block's forward and backward
issue on its tensor-parallel group, as PyTorch's DTensor plans issue them
(`runtime.strategies.tensor_parallel`; a test compares the two under the fake process group).

Per transformer layer, activations of t tokens x hidden, in the compute dtype:
- without sequence parallelism: forward all-reduces the outputs of the two row-parallel matrices
  (attention's output projection, the MLP's last), backward the input gradients of the
  column-parallel ones (q/k/v, the MLP's first: SwiGLU's gate and up share one input, reduced once);
- with sequence parallelism: forward all-gathers each column-parallel input and reduce-scatters
  each row-parallel output (the same bytes on the wire as the all-reduces, a tp-th of the norms'
  work), backward the converse.
The vocabulary-parallel embedding reduces its output (all-reduce, or reduce-scatter with sequence
parallelism), the LM head's gradient of its input likewise, and the vocabulary-parallel
cross-entropy all-reduces three numbers per token (max, sum of exponentials, the target's logit)
in fp32.

An MoE layer's are a dense layer's (torchtitan's TP plan of the MoE module: its input and output
as the MLP's), and one more in backward: its router, replicated (torchtitan's `NoParallel` gate),
takes a replicated input and hands back a partial gradient, which DTensor all-reduces (t x hidden,
in the activations' dtype) before the MLP's input gradient is reduced; a recomputed forward has
none of it.

With sequence parallelism a norm's parameters see a tp-th of the tokens: backward all-reduces
each one's gradient over the group (DTensor's Partial → Replicate). A ViT's replicated patch
embedding hands the first layer its tp-th of the tokens (no communication) and gathers that
layer's input gradient; its classifier gathers its input.

Placement (a named simplification): a block's collectives follow its compute op on the
tensor-parallel stream and the next op waits for them, rather than sitting between its
attention and MLP halves: the same critical path, since nothing runs beside them. A layer whose
backward recomputes its forward (full checkpointing, selective of every k-th layer, and op-level
selective: the runtime keeps no collective's output) issues its forward's collectives again but
the last: the recomputation stops once backward has what it needs (torch.utils.checkpoint's
early stop), before the reduction of the layer's output. With asyncTP (`async_tp`, under
torch.compile) inductor's micro-pipeline pass fuses the all-gather -> matmul and matmul ->
reduce-scatter pairs (`simulator.async_tp`): a fused pair's time takes the place of its GEMMs'
in the block's op and it issues no collective of its own; the others are issued as without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardsim.simulator.async_tp import AsyncTp
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.plan import Dep, Plan, _join
from shardsim.simulator.strategies.mesh import StageMesh
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import norm_tensors
from shardsim.specs.model.workload import Block

LOSS_REDUCTIONS = 3  # vocabulary-parallel cross-entropy: max, sum of exp, target logit per token
LOSS_BYTES = 4  # its reductions are fp32 (the loss runs in fp32)


@dataclass(frozen=True)
class TpCall:
    """One collective of a block's pass on its tensor-parallel group: `elems` per sample (the
    whole array, as nccl-tests counts it: a gather's output, a scatter's input; per call where
    not `per_sample`), of `esize` bytes each (0: the activations' dtype)."""

    coll: str  # all_reduce | all_gather | reduce_scatter
    elems: float
    what: str
    esize: int = 0
    per_sample: bool = True  # False: `elems` whatever the batch (a parameter's gradient)


def block_calls(b: Block, a: Arch, sp: bool, grad_esize: int) -> tuple[tuple[TpCall, ...], tuple[TpCall, ...]]:
    """The (forward, backward) tensor-parallel collectives of block `b` of a model of `a`;
    `grad_esize` the bytes of a gradient element (the norms' gradients under sequence parallelism)."""
    full = a.tokens * a.hidden  # one activation, every token
    text = a.traits.tokens == "text"
    # sequence parallelism: a norm's weight (and bias) sees a tp-th of the tokens, its gradient is
    # summed over the group (an all-reduce a parameter tensor)
    norm_grads = tuple(
        TpCall("all_reduce", a.hidden, "norm grad", grad_esize, per_sample=False) for _ in range(norm_tensors(a))
    )
    if b.kind == "layer":
        router = (TpCall("all_reduce", full, "router in grad"),) if b.moe is not None else ()
        if sp:
            fwd = (
                TpCall("all_gather", full, "attn in"),
                TpCall("reduce_scatter", full, "attn out"),
                TpCall("all_gather", full, "mlp in"),
                TpCall("reduce_scatter", full, "mlp out"),
            )
            bwd = (
                TpCall("all_gather", full, "mlp out grad"),
                *router,
                TpCall("reduce_scatter", full, "mlp in grad"),
                TpCall("all_gather", full, "attn out grad"),
                TpCall("reduce_scatter", full, "attn in grad"),
                *norm_grads,
                *norm_grads,
            )
            return fwd, bwd
        fwd = (TpCall("all_reduce", full, "attn out"), TpCall("all_reduce", full, "mlp out"))
        bwd = (*router, TpCall("all_reduce", full, "mlp in grad"), TpCall("all_reduce", full, "attn in grad"))
        return fwd, bwd
    if b.kind == "embed":
        if text and sp:
            return (TpCall("reduce_scatter", full, "embed out"),), (TpCall("all_gather", full, "embed out grad"),)
        if text:
            return (TpCall("all_reduce", full, "embed out"),), ()
        if sp:  # a replicated patch embedding: the first layer takes its tp-th of the tokens, gathers its gradient
            return (), (TpCall("all_gather", full, "layer0 in grad"),)
    if b.kind == "head" and text:
        loss = tuple(TpCall("all_reduce", a.tokens, "loss", LOSS_BYTES) for _ in range(LOSS_REDUCTIONS))
        if sp:
            fwd = (TpCall("all_gather", full, "head in"), *loss)
            return fwd, (TpCall("reduce_scatter", full, "head in grad"), *norm_grads)
        return loss, (TpCall("all_reduce", full, "head in grad"),)
    if b.kind == "head" and sp:  # a replicated classifier: its input gathered whole
        return (TpCall("all_gather", full, "head in"),), ()
    return (), ()


@dataclass
class TensorParallel:
    """A plan's tensor parallelism: each block's collectives, the blocks whose backward recomputes
    its forward (and its collectives), and asyncTP's fused pairs (`fused`; None without)."""

    meshes: list[StageMesh]  # of each rank class (pipeline stage)
    esize: int  # bytes per activation element (the compute dtype)
    calls: dict[str, tuple[tuple[TpCall, ...], tuple[TpCall, ...]]]
    recomputed: frozenset[str] = frozenset()
    fused: AsyncTp | None = None
    _layouts: dict[int, GroupLayout] = field(default_factory=dict)
    _memo: dict[tuple[str, str, int], tuple[tuple[str, float, str], ...]] = field(default_factory=dict)
    _extra: dict[tuple, float] = field(default_factory=dict)

    def layout(self, rc: int) -> GroupLayout:
        if rc not in self._layouts:
            self._layouts[rc] = self.meshes[rc].groups("tp")
        return self._layouts[rc]

    def pass_calls(self, b: Block, phase: str) -> tuple[TpCall, ...]:
        """Block `b`'s collectives of `phase` (fwd | bwd) in the order issued: a backward's are its
        recomputed forward's (if it recomputes one) then its own. A recomputed forward stops once
        it has rebuilt what backward needs: before the reduction of the layer's output
        (torch.utils.checkpoint's early stop)."""
        fwd, bwd = self.calls.get(b.name, ((), ()))
        return fwd if phase == "fwd" else (fwd[:-1] if b.name in self.recomputed else ()) + bwd

    def nbytes(self, c: TpCall, mb: int) -> float:
        """Bytes of call `c` at micro-batch `mb`."""
        return c.elems * (mb if c.per_sample else 1) * (c.esize or self.esize)

    def plain_calls(self, b: Block, phase: str, mb: int) -> tuple[TpCall, ...]:
        """Block `b`'s collectives of `phase` (`pass_calls`) issued as collectives: all but
        those asyncTP fuses with their matmuls."""
        calls = self.pass_calls(b, phase)
        if self.fused is None:
            return calls
        pairs = self.fused.pairs(b, mb)
        return tuple(c for c in calls if c.what not in pairs)

    def extra_s(self, rc: int, b: Block, mb: int, phase: str) -> float:
        """Seconds asyncTP's fused pairs of block `b`'s `phase` add to its compute op (0 without)."""
        if self.fused is None:
            return 0.0
        key = (calls_key(b), b.tokens, b.name in self.recomputed, phase, mb, rc)
        out = self._extra.get(key)
        if out is None:
            pairs = self.fused.pairs(b, mb)
            lay = self.layout(rc)
            out = self._extra[key] = sum(
                self.fused.extra_s(c.what, pairs[c.what], lay, self.nbytes(c, mb))
                for c in self.pass_calls(b, phase)
                if c.what in pairs
            )
        return out

    def after(self, p: Plan, rc: int, b: Block, mb: int, phase: str, op: int, tag: str) -> Dep:
        """Block `b`'s collectives of `phase` (fwd | bwd: with a recomputed forward's first; not
        those asyncTP fuses) after its compute op `op`; what the next op waits for."""
        calls = self._issued(b, phase, mb)
        if not calls:
            return op
        lay = self.layout(rc)
        deps: list[Dep] = [op]
        last = None
        for coll, nbytes, name in calls:
            last = p.comm(rc, "tp", coll, lay, nbytes, name + tag, deps, phase) or last
            deps = [last] if last is not None else deps
        return op if last is None else _join(op, last)

    def _issued(self, b: Block, phase: str, mb: int) -> tuple[tuple[str, float, str], ...]:
        """(collective, bytes, name before the op's tag) of each call that `after` issues
        (`pass_calls`), memoized: they depend on nothing else (`calls`, `recomputed` and `esize`
        are fixed)."""
        key = (b.name, phase, mb)
        out = self._memo.get(key)
        if out is None:
            calls = self.plain_calls(b, phase, mb)
            out = self._memo[key] = tuple((c.coll, self.nbytes(c, mb), f"TP {c.coll} {b.name} {c.what}") for c in calls)
        return out


def tensor_parallel(
    arch: Arch,
    blocks: tuple[Block, ...],
    meshes: list[StageMesh],
    sp: bool,
    esize: int,
    grad_esize: int,
    recomputed: frozenset[str],
    fused: AsyncTp | None = None,
) -> TensorParallel:
    """The plan's tensor parallelism for a model of `arch` whose (per-rank) `blocks` run on
    `meshes`; `recomputed`: the layers whose backward recomputes their forward; `fused`: asyncTP's
    fused pairs (None without)."""
    by_kind: dict[tuple[str, bool], tuple[tuple[TpCall, ...], tuple[TpCall, ...]]] = {}
    for b in blocks:  # a block's calls go by its kind and whether it routes to experts
        if calls_key(b) not in by_kind:
            by_kind[calls_key(b)] = block_calls(b, arch, sp, grad_esize)
    return TensorParallel(meshes, esize, {b.name: by_kind[calls_key(b)] for b in blocks}, recomputed, fused)


def calls_key(b: Block) -> tuple[str, bool]:
    """What decides block `b`'s tensor-parallel collectives (`block_calls`): its kind and whether it is an MoE layer."""
    return b.kind, b.moe is not None
