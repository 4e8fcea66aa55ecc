"""One task of a sweep, as both executors run it (`execute`'s process pool and `ray_executor`'s
Ray tasks): a configuration's prediction as its row; and the cores this process may run on."""

from __future__ import annotations

import os
from typing import Any

from shardsim.simulator.gcpause import paused_gc
from shardsim.specs.model.workload import Workload
from shardsim.sweep.rows import row_of
from shardsim.sweep.space import Candidate


def predict_row(c: Candidate, w: Workload, algo: str) -> dict[str, Any]:
    """One prediction as a sweep row; a configuration that does not fit in memory is not simulated
    (its row has the memory, NaN times: pruned by memory before simulation). The cyclic garbage
    collector stays off until the prediction is freed (it makes no cycles): re-enabled in
    between, it would scan the plan's and the timeline's objects once or twice for nothing."""
    from shardsim.simulator.predict import predict  # the engine: imported here, and by the pool before it forks

    with paused_gc():
        return row_of(c, predict(c.cfg, algo=algo, workload=w, cluster=c.cluster, prune_unfit=True))


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
