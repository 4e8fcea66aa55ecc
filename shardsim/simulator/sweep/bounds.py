"""Lower bounds on a configuration's step time, from the compute model alone (no plan, no
simulation): what the pruned search (`sweep.prune`) compares with the best found.

The compute bound (`compute_bound_s`): every block's forward, backward and recomputation at
the micro-batch the plan runs, with communication free (perfectly overlapped, zero time) and
every compute op at full speed. It is a lower bound of the simulated step because:
- the ops of one rank class's compute stream run one after another (`plan.Plan.add`), each
  taking at least its `duration` (`engine`: a timeout of it, or slower: NCCL's SM share,
  shared cores), and a step's time is the latest end of any rank class;
- a data-parallel class runs grad_accum × (forward + backward of every block, recomputation of
  the checkpointed layers), then the optimizer step on its own parameters (`steps.data_parallel_plan`);
- a pipeline stage runs grad_accum × microbatches × its blocks' forward + backward, and each
  schedule step also waits for the chain through the stages before it: the first
  microbatch's forward through stages 0..s-1 before its own first op, and after its last
  backward, that microbatch's backward through stages s-1..0 before stage 0 ends the step
  (the next step's first forward on stage 0 waits for that end; `pipeline._Pipeline.step`).
  Stage s's bound is grad_accum × (microbatches × (F_s + B_s) + Σ_{j<s} (F_j + B_j)).
What it leaves out (so it stays below): every collective and send, FSDP's own CPU work, the
sharded optimizer's overhead, pipeline stages' optimizer steps, the interleaving of the
schedule. `tests/test_sweep_prune.py` checks bound ≤ simulated step for every configuration of
several spaces.
"""

from __future__ import annotations

from shardsim.simulator.checkpointing import checkpointing_of
from shardsim.simulator.predict import Prepared
from shardsim.simulator.strategies.steps import BlockTimes, rank_classes
from shardsim.simulator.workload.model import Block


def _pass_s(bt: BlockTimes, blocks: list[Block], mb: int) -> tuple[float, float]:
    """(forward, backward with recomputation) seconds of `blocks` for one micro-batch of `mb`."""
    fwd = bwd = 0.0
    for b in blocks:
        c = bt.block(b, mb)
        fwd += c.fwd_s
        bwd += c.bwd_s + (bt.recompute_s(b, mb) if b.kind == "layer" else 0.0)
    return fwd, bwd


def compute_bound_s(s: Prepared) -> float:
    """The compute bound of `s`'s step (seconds; see the module's docstring)."""
    cfg, res, w = s.cfg, s.res, s.ranks_workload
    bt = BlockTimes(s.compute, checkpointing_of(cfg, w.layers))
    mb, K = res.microbatch_size, cfg.grad_accum
    if not cfg.strategy.spec.is_pipeline:
        (rc, blocks), *_ = rank_classes(res, w, pipeline=False)
        fwd, bwd = _pass_s(bt, blocks, mb)
        tensors = sum(b.param_tensors for b in blocks)
        return K * (fwd + bwd) + s.compute.optimizer(rc.local_params, tensors)
    M = res.microbatches
    best = 0.0
    before = 0.0  # Σ_{j<s} (F_j + B_j): one microbatch through the stages before this one
    for _, blocks in rank_classes(res, w, pipeline=True):
        fwd, bwd = _pass_s(bt, blocks, mb)
        best = max(best, K * (M * (fwd + bwd) + before))
        before += fwd + bwd
    return best
