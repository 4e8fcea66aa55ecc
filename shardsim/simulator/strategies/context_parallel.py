"""Context parallelism's collectives in a step's plan: ring attention as PyTorch runs it
(`torch.distributed.tensor.experimental._context_parallel._attention`, torch 2.13), on each
layer's context-parallel group of cp ranks.

Each rank holds a cp-th of every sample's tokens (`cp_workload`) and its attention runs in cp
rounds, each against another rank's keys and values (K/V: over the rank's tokens, in the compute
dtype, concatenated; repeated to the query heads, `kv_elems`):
- forward, rotate method ``allgather`` (PyTorch's default): one all-gather of K/V over the group,
  issued before round 0 and waited for by round 1; ``alltoall``: before each round but the last,
  K/V passed to the next rank of the ring (`permute_tensor`, an all-to-all in which each rank sends
  to one), waited for by the next round;
- backward: K/V rotated again the same way, and the gradients of K/V (fp32: PyTorch's
  `convert_to_f32`) passed round the ring after every round (always all-to-all: cp of them),
  each waited for by the next round, the last at the end of the layer's attention backward.
A ring pass is planned as a send over the group's ring (`send_recv`; the wrap-around edge from
the last rank to the first is left out of the links' load, a named simplification: it runs
beside the others, in the other direction of the links it shares).

Placement (a named simplification): a layer's pass is one op of its work other than attention,
then one op per round of attention (equal rounds: `cp_workload`; consecutive rounds between
which no collective is issued or awaited, the forward's after the all-gather, are one op of
their summed seconds: the same clock, with fewer ops to simulate); the collectives are issued
after the first op and overlap the rounds as PyTorch's do (a round waits for the K/V it uses).
In the layer the projection of q/k/v comes before attention and the rest after; here all of it
before, which leaves the critical path as it is (nothing else runs on the compute stream). A
layer whose backward recomputes its forward (checkpointing) issues the forward's K/V rotation
again at the start of its backward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.plan import Dep, Plan, _join
from shardsim.simulator.strategies.mesh import StageMesh
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.workload import Block

GRAD_KV_BYTES = 4  # PyTorch's `_cp_options.convert_to_f32`: K/V gradients accumulated and passed in fp32
STREAM = "cp"


@dataclass(frozen=True)
class RingCall:
    """One collective of a layer's ring attention, issued before round `round` (K/V) or after it
    (`after`: the K/V gradients)."""

    coll: str  # all_gather | send_recv
    nbytes_per_sample: float  # bytes per sample (an all-gather's output, a ring pass's buffer)
    what: str
    round: int
    after: bool = False


def kv_elems(a: Arch, tp: int) -> int:
    """Elements of one rank's K and V per sample: the rank's query heads over its tokens (`a` the
    rank's shape: a cp-th of the sequence). With grouped-query attention the K/V that ring
    attention passes are those repeated to the query heads before SDPA, as torchtitan's Llama does
    (`repeat_kv` in torchtitan/models/llama3/model/model.py, `Attention.forward`): PyTorch's ring
    rotates the K/V the attention kernel is given."""
    return 2 * a.tokens * (a.q_dim // tp)


def ring_calls(a: Arch, tp: int, cp: int, rotate: str, esize: int) -> tuple[tuple[RingCall, ...], tuple[RingCall, ...]]:
    """The (forward, backward) collectives of one layer's ring attention over `cp` ranks; `a` is
    one rank's shape, `esize` the bytes of an activation element."""
    kv = kv_elems(a, tp)

    def rotation(what: str) -> tuple[RingCall, ...]:
        if rotate == "allgather":
            return (RingCall("all_gather", cp * kv * esize, f"{what} all-gather", 0),)
        return tuple(RingCall("send_recv", kv * esize, f"{what} pass {i}", i) for i in range(cp - 1))

    grads = tuple(RingCall("send_recv", kv * GRAD_KV_BYTES, f"dK/dV pass {i}", i, after=True) for i in range(cp))
    return rotation("K/V"), rotation("K/V") + grads


@dataclass
class ContextParallel:
    """A plan's context parallelism: each layer's ring attention, its rounds' seconds, and the
    layers whose backward recomputes their forward."""

    meshes: list[StageMesh]  # of each rank class (pipeline stage)
    cp: int
    calls: tuple[tuple[RingCall, ...], tuple[RingCall, ...]]
    attention: Callable[[int], tuple[float, float]]  # a layer's (forward, backward) attention seconds at a batch
    recomputed: frozenset[str] = frozenset()
    fuse: bool = True  # consecutive rounds that wait for nothing but each other as one op (exact)
    _layouts: dict[int, GroupLayout] = field(default_factory=dict)
    _attention_s: dict[int, tuple[float, float]] = field(default_factory=dict)

    def attention_s(self, mb: int) -> tuple[float, float]:
        if mb not in self._attention_s:
            self._attention_s[mb] = self.attention(mb)
        return self._attention_s[mb]

    def layout(self, rc: int) -> GroupLayout:
        if rc not in self._layouts:
            self._layouts[rc] = self.meshes[rc].groups("cp")
        return self._layouts[rc]

    def run(self, p: Plan, rc: int, name: str, deps: list[Dep], dur: float, phase: str, b: Block, mb: int) -> int:
        """Layer `b`'s pass `phase` (fwd | bwd) of `dur` seconds: its other work, then its attention
        rounds with their collectives on the context-parallel group; the last op's id. Round r
        waits for the K/V issued before round r - 1 and the K/V gradients passed after round r - 2
        (PyTorch waits for each after the next round's kernel); the pass ends with the last."""
        fwd_calls, bwd_calls = self.calls
        attn = min(self.attention_s(mb)[0 if phase == "fwd" else 1], dur)
        lay = self.layout(rc)

        def issue(calls: tuple[RingCall, ...], after: Dep, tag: str = "") -> list[int]:
            ops = (p.comm(rc, STREAM, c.coll, lay, c.nbytes_per_sample * mb, f"CP {c.what} {name}{tag}", [after], phase)
                   for c in calls)  # fmt: skip
            return [op for op in ops if op is not None]

        rest = p.add(rc, "compute", "compute", name, deps, duration=dur - attn, phase=phase)
        calls = fwd_calls if phase == "fwd" else bwd_calls
        before = {r: [c for c in calls if c.round == r and not c.after] for r in range(self.cp)}
        after = {r: [c for c in calls if c.round == r and c.after] for r in range(self.cp)}
        issued_before: dict[int, list[int]] = {}
        issued_after: dict[int, list[int]] = {}
        if phase == "bwd" and b.name in self.recomputed:  # the recomputed forward's rotation, again
            issued_before[-1] = issue(fwd_calls, rest, " (recompute)")
        prev, first = rest, 0
        dur_r = attn / self.cp
        for r in range(self.cp):
            issued_before[r] = issue(tuple(before[r]), prev)
            wait = [*issued_before.get(r - 1, []), *issued_after.get(r - 2, [])]
            if self.fuse and r > 0 and not (wait or issued_before[r] or issued_after[r - 1]):
                op = p.ops[prev]  # nothing issued or awaited between the rounds: one op, the same clock
                op.duration += dur_r
                op.name = f"{name} attn {first}-{r}"
            else:
                prev = p.add(rc, "compute", "compute", f"{name} attn {r}", [prev, *wait], duration=dur_r, phase=phase)
                first = r
            issued_after[r] = issue(tuple(after[r]), prev)
        left = [op for r in (self.cp - 2, self.cp - 1) for op in issued_after.get(r, [])]
        if not left:
            return prev
        return p.add(rc, "compute", "compute", f"{name} attn end", [_join(prev, *left)], phase=phase)


def context_parallel(
    arch: Arch,
    meshes: list[StageMesh],
    tp: int,
    cp: int,
    rotate: str,
    esize: int,
    attention: Callable[[int], tuple[float, float]],
    recomputed: frozenset[str],
) -> ContextParallel:
    """The plan's context parallelism for a model whose rank's shape is `arch` (a cp-th of the
    sequence) on `meshes`; `attention` a layer's attention seconds at a microbatch size."""
    return ContextParallel(meshes, cp, ring_calls(arch, tp, cp, rotate, esize), attention, recomputed)
