"""The batch search of a sweep (`SweepSpace.max_batch`): the largest micro-batch per device at
which a configuration fits in memory, by the memory model alone (no step is simulated)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

from shardsim.config import RunConfig, resolve
from shardsim.core.errors import ConfigError
from shardsim.specs.hardware.topology import Cluster
from shardsim.specs.model.workload import Workload


def largest_fitting(candidates: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    """The largest of the ascending `candidates` for which `fits` holds, `fits` being monotone
    (true up to some candidate, false from there on); None when it fails on the first. Doubling
    (candidates 1, 2, 4, 8, ... by index, so a batch doubles each try where the candidates are
    its multiples), then bisection between the last that fit and the first that did not:
    about 2·log2(n) calls of `fits` for n candidates."""
    if not candidates or not fits(candidates[0]):
        return None
    good, bad = 0, len(candidates)  # candidates[good] fits; from candidates[bad] on none does
    i = 1
    while i < len(candidates):
        if not fits(candidates[i]):
            bad = i
            break
        good = i
        i = 2 * i + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(candidates[mid]):
            good = mid
        else:
            bad = mid
    return candidates[good]


@lru_cache(maxsize=64)
def _rank_workload(
    w: Workload, tp: int, sequence_parallel: bool, cp: int = 1, expert_tp: int | None = None
) -> Workload:
    from shardsim.simulator.predict import rank_workload

    return rank_workload(w, tp, sequence_parallel, cp=cp, expert_tp=expert_tp)


def fits_at(cfg: RunConfig, cluster: Cluster, w: Workload) -> bool:
    """Whether `cfg` fits in memory on `cluster` (`predict.step_memory`: what `fits` of a
    prediction says); False where the configuration is refused at that batch."""
    from shardsim.simulator.predict import step_memory

    n_layers = len(w.layers) or len(w.blocks)
    try:
        cfg, res = resolve(
            cfg,
            cluster.world,
            n_layers,
            tied_embeddings=w.tied_embeddings,
            arch=w.arch,
            devices_per_node=cluster.devices_per_node,
        )
    except ConfigError:
        return False
    ranks_w = _rank_workload(w, res.tp, cfg.strategy.sequence_parallel, res.cp, res.dims.expert_tp)
    dev = cluster.instance.device
    return step_memory(cfg, res, ranks_w, cluster).required_gib <= dev.memory_gib
