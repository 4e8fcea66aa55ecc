"""The op program each rank runs in one training step (built by `strategies.build.build_plan`).

Ranks that run the same program (all ranks of ZeRO/ZeRO-2D/DDP; all replicas of one pipeline
stage) form one *rank class* and are simulated once; a collective op of a class stands for the
call in every group at once, so the network sees the whole world's traffic.

Streams: with overlap (`Plan.overlap`, see `strategies.build.overlaps`) each class has a compute
stream and one stream per communication kind, ops on one stream run in order; without overlap
everything runs on one stream except `ASYNC_STREAMS` (a pipeline's isends: asynchronous on gloo
too). An op given a `lane` runs in order with the ops of its stream in the same lane only (gloo's
sends to one peer: `strategies.pipeline.isend_op`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from shardsim.simulator.compute import FsdpCpu
from shardsim.simulator.network.alltoall import Exchange
from shardsim.simulator.network.collectives import GroupLayout

if TYPE_CHECKING:
    from shardsim.specs.model.workload import Block

ASYNC_STREAMS = frozenset({"p2p_fwd", "p2p_bwd", "p2p_fwd_post", "p2p_bwd_post"})  # own streams even
# without overlap: pipelining's isends (and their posting, with a rendezvous backend)
Join = tuple[int, ...]  # ops that an op waits for all of (see `_join`)
Dep = int | Join | None  # what an op waits for: an op, a Join, or nothing


@dataclass(slots=True)
class Op:
    """One compute, communication or optimizer op of a rank class, on one stream."""

    id: int
    rank_class: int
    stream: str
    kind: str  # compute | comm | optimizer
    name: str
    deps: list[int]
    duration: float = 0.0
    coll: str | None = None
    layout: GroupLayout | None = None
    nbytes: float = 0.0
    phase: str = ""  # fwd | bwd | sync | opt | p2p
    peer: int | None = None  # the receiving rank class of a point-to-point send
    exchange: Exchange | None = None  # an all-to-all's per-peer shares (None: even)


@dataclass(frozen=True)
class RankClass:
    """Ranks [first_rank, first_rank + count) that run the same program."""

    label: str
    first_rank: int
    count: int
    params: float  # parameters of this class's model piece (unsharded)
    local_params: float  # parameters this rank owns (after sharding)
    units: tuple[tuple[str, float], ...]  # (name, params) of its FSDP units / gathered pieces


class BlockCollectives(Protocol):
    """The collectives a plan adds after a block's compute op, and what they add to its time
    (tensor parallelism's: `strategies.tensor_parallel.TensorParallel`)."""

    def after(self, p: Plan, rc: int, b: Block, mb: int, phase: str, op: int, tag: str) -> Dep: ...

    def extra_s(self, rc: int, b: Block, mb: int, phase: str) -> float: ...


class LayerAttention(Protocol):
    """A layer's pass as context parallelism runs it (`strategies.context_parallel.ContextParallel`):
    its ops and collectives; the last op's id."""

    def run(self, p: Plan, rc: int, name: str, deps: list[Dep], dur: float, phase: str, b: Block, mb: int) -> int: ...


@dataclass
class Plan:
    """The ops of every rank class, in the order added: each op waits for its `deps` and for the
    op added before it on its stream (one stream per class without `overlap`, but ASYNC_STREAMS)."""

    ops: list[Op] = field(default_factory=list)
    classes: list[RankClass] = field(default_factory=list)
    overlap: bool = True
    fsdp: FsdpCpu = field(default_factory=FsdpCpu)  # FSDP2's own work per unit parameter
    tp: BlockCollectives | None = None  # each block's tensor-parallel collectives (none without)
    cp: LayerAttention | None = None  # each layer's ring attention (none without context parallelism)
    ep: LayerAttention | None = None  # each MoE layer's all-to-alls and experts (none without expert parallelism)
    _last_on_stream: dict[tuple, int] = field(default_factory=dict)

    def add(
        self,
        rc: int,
        stream: str,
        kind: str,
        name: str,
        deps: list[Dep],
        duration: float = 0.0,
        coll: str | None = None,
        layout: GroupLayout | None = None,
        nbytes: float = 0.0,
        phase: str = "",
        lane: int | None = None,
    ) -> int:
        """Append an op of rank class `rc` (its other fields as `Op`'s); returns its id. It waits
        for the op added before it on its stream, in its `lane` when given."""
        if not self.overlap and stream not in ASYNC_STREAMS:
            stream = "main"
        key: tuple = (rc, stream) if lane is None else (rc, stream, lane)
        d = _ids(deps)
        prev = self._last_on_stream.get(key)
        if prev is not None:
            d.append(prev)
        if len(d) == 2:  # the usual case (a dependency and the stream's previous op): sorted, unique
            a, b = d
            d = [a] if a == b else d if a < b else [b, a]
        elif len(d) > 2:
            d = sorted(set(d))
        op_id = len(self.ops)
        self.ops.append(Op(op_id, rc, stream, kind, name, d, duration, coll, layout, nbytes, phase))
        self._last_on_stream[key] = op_id
        return op_id

    def comm(
        self,
        rc: int,
        stream: str,
        coll: str,
        layout: GroupLayout,
        nbytes: float,
        name: str,
        deps,
        phase: str,
        lane: int | None = None,
    ):
        """Append a collective (or send) of `nbytes` over `layout` (in `lane` of its stream, as
        `add`); None when it moves nothing."""
        if not moves(layout, nbytes):
            return None
        return self.add(rc, stream, "comm", name, deps, 0.0, coll, layout, nbytes, phase, lane)

    def all_to_all(
        self,
        rc: int,
        stream: str,
        layout: GroupLayout,
        nbytes: float,
        name: str,
        deps,
        phase: str,
        exchange: Exchange | None = None,
    ):
        """Append an all-to-all in every group of `layout` (an MoE dispatch or combine): each rank's
        send buffer `nbytes` on average, split over its group as `exchange` says (even when None);
        None when it moves nothing."""
        op = self.comm(rc, stream, "all_to_all", layout, nbytes, name, deps, phase)
        if op is not None:
            self.ops[op].exchange = exchange
        return op


def moves(layout: GroupLayout, nbytes: float) -> bool:
    """Does a collective or send over `layout` move anything (a group of one, or no bytes: no op)?"""
    return layout.size >= 2 and nbytes > 0


def _join(a: Dep, *others: Dep) -> Dep:
    """`a` and the others, for the next op to wait on: `a` itself when there are no others,
    else a Join of them all. Exact: a zero-length op waiting for them would end when the last
    of them does, which is when the op after it would start; without one, a pipeline's plan
    has a third fewer ops."""
    if all(x is None for x in others):
        return a
    return tuple(dict.fromkeys(_ids((a, *others))))


def _ids(deps: Iterable[Dep]) -> list[int]:
    """The op ids of `deps`, Joins expanded, Nones dropped."""
    out: list[int] = []
    for x in deps:
        if type(x) is int:
            out.append(x)
        elif x is not None:
            out += x
    return out
