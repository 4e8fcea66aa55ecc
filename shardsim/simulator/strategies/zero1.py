"""ZeRO-1 (strategy zero1) as `ZeroRedundancyOptimizer` over `DistributedDataParallel` runs it
(torch/distributed/optim/zero_redundancy_optimizer.py, parameters_as_bucket_view False,
overlap_with_ddp False): forward and backward exactly as DDP (`ddp`: bucket all-reduces of fp32
gradients over the data-parallel group), then each rank steps Adam over its partition only, and
`_sync_params` broadcasts every partition from its owner (one `broadcast` per parameter, all
issued async and waited for before `step()` returns), in the parameters' fp32.

Approximations (named):
- the partition: PyTorch assigns whole parameter tensors greedily (largest first, to the rank
  with the fewest elements so far), so its busiest rank holds about the larger of a dp-th of
  the parameters and the largest tensor (`largest_partition`; checked against PyTorch's own
  partition in tests/unit/test_zero1.py); the optimizer step and Adam's state are that rank's.
- the broadcasts: a source's per-parameter broadcasts are one broadcast of a dp-th of the
  parameters (the total, all of them, is exact; NCCL's per-call latency is counted once per
  source rank, not once per tensor); the dp sources' run one after another on the
  communication stream, as NCCL runs one communicator's calls.
"""

from __future__ import annotations

from shardsim.config import Resolved, RunConfig
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.plan import Dep, Plan
from shardsim.simulator.strategies.ddp import GRAD_BYTES, ddp_backward, ddp_forward
from shardsim.simulator.strategies.mesh import stage_mesh
from shardsim.simulator.strategies.steps import Piece, data_parallel_plan, split_blocks
from shardsim.specs.model.workload import Block, Workload
from shardsim.specs.parallel_dims import DATA

PARAM_BYTES = GRAD_BYTES  # the broadcast parameters are the fp32 masters DDP wraps (autocast casts copies)


def largest_partition(params: float, blocks: list[Block], dp: int) -> float:
    """Parameters of the busiest rank's partition when `dp` ranks split `params` (of `blocks`)
    greedily by whole tensors: a dp-th, or the largest tensor when it is bigger (then it is
    alone on its rank)."""
    largest = max((b.largest_tensor for b in blocks), default=0)
    return max(params / dp, float(largest)) if dp > 1 else params


def zero1_plan(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    """Strategy zero1: DDP's micro-steps, then the partitioned step and its broadcasts."""
    embed, layers, head = split_blocks(w)
    m = stage_mesh(res)
    group = m.groups(*DATA)
    piece = Piece(embed, layers, head, None, group)
    dp = m.dp

    def step(p: Plan, rc: int, cm: ComputeModel, pc: Piece, model_params: float, deps: list[Dep]) -> Dep:
        rcl = p.classes[rc]
        own = largest_partition(rcl.local_params, pc.blocks, dp)
        tensors = sum(b.param_tensors for b in pc.blocks)
        dur = cm.optimizer(own, max(1, round(tensors / dp)))
        prev: Dep = p.add(rc, "compute", "optimizer", "optimizer step (own partition)", deps, duration=dur, phase="opt")
        share = rcl.local_params / dp * PARAM_BYTES
        for r in range(dp):
            prev = p.comm(rc, "ar", "broadcast", group, share, f"broadcast partition {r}", [prev], "sync") or prev
        return prev

    data_parallel_plan(p, cm, cfg, res, w, piece, ddp_forward, ddp_backward, step=step)
