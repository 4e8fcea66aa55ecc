"""Lower bounds on a configuration's step time without a plan or a simulation: what the pruned
search (`sweep.prune`) compares with the best found.

The compute bound (`compute_bound_s`): every block's forward, backward and recomputation at
the micro-batch the plan runs, every compute op at full speed, and of the communication only
what sits on the critical path whatever the overlap, each call alone on the network
(`collectives.call_alone_s`: the engine's algorithm and phases, its bottleneck link): tensor
parallelism's collectives after each block's compute (beside it with asyncTP: the longer of the
two) and a pipeline's sends from stage to stage. It is a lower bound of the simulated step because:
- the ops of one rank class's compute stream run one after another (`plan.Plan.add`), each
  taking at least its `duration` (`engine`: a timeout of it, or slower: NCCL's SM share,
  shared cores); a block's tensor-parallel collectives follow its compute op and the next op
  waits for them (`tensor_parallel.TensorParallel.after`); a call takes at least its time
  alone; a step's time is the latest end of any rank class;
- a data-parallel class runs grad_accum × (forward + backward of every block, recomputation of
  the checkpointed layers), then the optimizer step on its own parameters (`steps.data_parallel_plan`);
- a pipeline stage runs grad_accum × microbatches × its blocks' forward + backward, and each
  schedule step also waits for the chain through the stages before it: the first
  microbatch's forward through stages 0..s-1 (each stage's forward, then its send of the
  activation) before its own first op, and after its last backward, that microbatch's backward
  through stages s-1..0 (a send of the input gradient, then the stage's backward) before stage 0
  ends the step (the next step's first forward on stage 0 waits for that end; `pipeline._Pipeline.step`);
  stage 0's optimizer step follows the last step's end.
  Stage s's bound is grad_accum × (microbatches × (F_s + B_s) + Σ_{j<s} (F_j + B_j + send_j→j+1 +
  send_j+1→j)) + optimizer_0.
What it leaves out (so it stays below): data-parallel collectives (all-gathers, reduce-scatters,
all-reduces: overlapped, or not, depending on the plan), the slowdown of shared links, FSDP's own
CPU work, the sharded optimizer's overhead, the interleaving of the schedule.
`tests/test_sweep_prune.py` checks bound ≤ simulated step for every configuration of several spaces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardsim.simulator.checkpointing import checkpointing_of
from shardsim.simulator.compute import DTYPE_BYTES
from shardsim.simulator.network.collectives import GroupLayout, call_alone_s
from shardsim.simulator.network.links import LinkGraph, links_for
from shardsim.simulator.predict import Prepared
from shardsim.simulator.strategies.build import plan_tensor_parallel
from shardsim.simulator.strategies.pipeline import activation_send, gradient_send
from shardsim.simulator.strategies.steps import BlockTimes, rank_classes
from shardsim.simulator.strategies.tensor_parallel import TensorParallel
from shardsim.simulator.workload.model import Block

PASSES = ("fwd", "bwd")


@dataclass
class _Wire:
    """Calls timed alone on the network, once per (collective, layout, bytes)."""

    g: LinkGraph
    algo: str
    backend: str
    mics: bool
    _memo: dict[tuple, float] = field(default_factory=dict)  # per call
    _passes: dict[tuple, float] = field(default_factory=dict)  # per block pass

    def alone_s(self, coll: str, layout: GroupLayout, nbytes: float) -> float:
        key = (coll, layout, nbytes)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = call_alone_s(self.g, coll, layout, nbytes, self.algo, self.backend, self.mics)
        return t

    def pass_s(self, tp: TensorParallel, b: Block, phase: str, layout: GroupLayout, mb: int) -> float:
        """Seconds of block `b`'s tensor-parallel calls of `phase` one after another, each alone;
        once per what decides them (`TensorParallel.pass_calls`: the block's kind, whether it
        recomputes its forward) for this `tp`, layout and micro-batch."""
        key = (b.kind, phase, b.name in tp.recomputed, layout, mb)
        t = self._passes.get(key)
        if t is None:
            t = self._passes[key] = sum(self.alone_s(c.coll, layout, tp.nbytes(c, mb)) for c in tp.pass_calls(b, phase))
        return t


def _pass_s(
    bt: BlockTimes, blocks: list[Block], mb: int, tp: TensorParallel | None, wire: _Wire, rc: int
) -> tuple[float, float]:
    """(forward, backward with recomputation) seconds of `blocks` of rank class `rc` for one
    micro-batch of `mb`, each block's tensor-parallel collectives after it (beside it with asyncTP)."""
    fwd = bwd = 0.0
    for b in blocks:
        c = bt.block(b, mb)
        f, bw = c.fwd_s, c.bwd_s + (bt.recompute_s(b, mb) if b.kind == "layer" else 0.0)
        if tp is not None:
            lay = tp.layout(rc)
            cf, cb = (wire.pass_s(tp, b, ph, lay, mb) for ph in PASSES)
            f, bw = (max(f, cf), max(bw, cb)) if tp.overlap else (f + cf, bw + cb)
        fwd += f
        bwd += bw
    return fwd, bwd


def compute_bound_s(s: Prepared, algo: str = "auto") -> float:
    """The compute bound of `s`'s step (seconds; see the module's docstring)."""
    from shardsim.simulator.predict import _engine_options

    cfg, res, w = s.cfg, s.res, s.ranks_workload
    ckpt = checkpointing_of(cfg, w.layers)
    bt = BlockTimes(s.compute, ckpt)
    tp = plan_tensor_parallel(cfg, res, w, ckpt)
    wire = _Wire(links_for(s.cluster), algo, cfg.backend, _engine_options(s)["mics"])
    mb, K = res.microbatch_size, cfg.grad_accum
    pipeline = cfg.strategy.spec.is_pipeline
    classes = rank_classes(res, w, pipeline=pipeline)
    rc0, blocks0 = classes[0]
    optimizer = s.compute.optimizer(rc0.local_params, sum(b.param_tensors for b in blocks0))
    if not pipeline:
        fwd, bwd = _pass_s(bt, blocks0, mb, tp, wire, 0)
        return K * (fwd + bwd) + optimizer
    M, R, ebytes = res.microbatches, res.world // res.pp, DTYPE_BYTES[cfg.precision]
    best = 0.0
    before = 0.0  # Σ_{j<s} (F_j + B_j + sends): one microbatch through the stages before this one
    for st, (_, blocks) in enumerate(classes):
        fwd, bwd = _pass_s(bt, blocks, mb, tp, wire, st)
        best = max(best, K * (M * (fwd + bwd) + before))
        if st + 1 < res.pp:  # the activation to stage st + 1, and its input gradient back
            fwd += wire.alone_s("send_recv", *activation_send(st, R, blocks, mb, ebytes))
            bwd += wire.alone_s("send_recv", *gradient_send(st + 1, R, classes[st + 1][1], mb, ebytes))
        before += fwd + bwd
    return best + optimizer
