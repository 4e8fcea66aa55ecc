"""The pruned search: every configuration assessed without simulation first (memory, then a
lower bound of its step time, `bounds`), then simulated best-first (highest bound on samples/s
first) in rounds, skipping those that can no longer matter.

What stays exact (identical to simulating everything; `tests/test_sweep_prune.py` compares):
each cluster's `keep` leading rows (rank and figures: the recommendation's best and runner-up,
and the report's `--top` rows), the two leading data-parallel rows (the recommended degree and
its runner-up), the cheapest (a cluster's price is the same for all its rows: its fastest is
its cheapest), and with `plots` the rows the plots draw (each cluster's best pipeline per pp and
best layout per tensor-parallel degree, and its `keep` leading pipelines). Never pruned:
the ddp/zero/zero2d rows without tensor parallelism (the plots and the scaling tables show
each), every ddp/zero/zero2d row of a sweep over several cluster sizes, and on demand the rows
the scaling columns and tables need (`_scaling_demand`).

A row pruned keeps its memory and fit, with NaN times; its `pruned` column names the rule:
- `PRUNED_MEMORY` ("memory"): it does not fit (as an exhaustive sweep does too: not simulated);
- `PRUNED_COMPUTE` ("compute bound"): global batch / compute bound (an upper bound on its
  samples/s) is below the `K`-th best samples/s already simulated in every group it belongs to;
- `PRUNED_CHAIN` ("chain bound"): the same with the dependency-chain bound
  (`engine.chain_bound`: its plan built, every collective alone on the network, not simulated),
  tried only where the compute bound did not prune and every group has its K best already
  (it costs about half a prediction: the plan and the engine's set-up).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shardsim.simulator.sweep.space import Candidate
from shardsim.simulator.workload.model import Workload

PRUNED_MEMORY = "memory"
PRUNED_COMPUTE = "compute bound"
PRUNED_CHAIN = "chain bound"
SLACK = 1e-9  # relative: a bound within this of the K-th best is not pruned (float rounding of both)
ROUND = 16  # candidates simulated per round (one `predict_all` call): the same whatever the workers, so are the rows
SCALING_LINES = 8  # `plots.scaling_configs`'s limit: the pipelines a scaling table may show


@dataclass
class Assessed:
    """A candidate before simulation: its row without times, and the upper bound on its samples/s
    (None when it does not fit)."""

    row: dict[str, Any]
    rate_bound: float | None


def assess(c: Candidate, w: Workload) -> Assessed:
    """Memory first (no plan), then the compute bound (`bounds.compute_bound_s`)."""
    from shardsim.simulator.predict import prepare
    from shardsim.simulator.sweep.bounds import compute_bound_s
    from shardsim.simulator.sweep.rows import row_of

    s = prepare(c.cfg, workload=w, cluster=c.cluster)
    row = row_of(c, s.unsimulated())
    if not s.fits:
        return Assessed(row | {"pruned": PRUNED_MEMORY}, None)
    bound = compute_bound_s(s)
    return Assessed(row, s.res.global_batch / bound if bound > 0 else float("inf"))


def chain_rate(c: Candidate, w: Workload, algo: str) -> float:
    """global batch / the dependency-chain bound of `c` (`predict.chain_bound_s`): an upper bound on its samples/s."""
    from shardsim.simulator.predict import chain_bound_s, prepare

    s = prepare(c.cfg, workload=w, cluster=c.cluster)
    bound = chain_bound_s(s, algo)
    return s.res.global_batch / bound if bound > 0 else float("inf")


def _groups(c: Candidate, keep: int, plots: bool, multi_world: bool) -> list[tuple[tuple, int]] | None:
    """The ranking groups `c` belongs to, each with how many of its leading rows must be exact;
    None when `c` is never pruned."""
    s = c.cfg.strategy
    cluster = (c.cluster.instance.name, c.cluster.nodes)
    pipeline = s.spec.is_pipeline
    if not pipeline and (s.tp == 1 or multi_world):
        return None
    out: list[tuple[tuple, int]] = [((cluster, "all"), keep)]
    if not pipeline:
        out.append(((cluster, "sdp"), 2))
    else:
        out.append(((cluster, "pipelines"), max(keep, SCALING_LINES) if multi_world else keep))
    if plots and pipeline and s.tp == 1:
        out.append(((cluster, "pp", s.pp), 1))
    if plots and s.tp > 1:
        out.append(((cluster, "tp", s.tp), 1))
    return out


def pruned_rows(
    candidates: Sequence[Candidate],
    w: Workload,
    simulate: Callable[[Sequence[Candidate]], list[dict[str, Any]]],
    *,
    algo: str = "auto",
    keep: int = 2,
    plots: bool = False,
    progress: Callable[[int, int, float], None] | None = None,
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Rows for `candidates` in their order (each with a `pruned` column: "" when simulated), and
    how many were pruned by each rule. `simulate(batch)` predicts a batch of candidates (rows in
    its order)."""
    n = len(candidates)
    worlds = {(c.cluster.instance.name, c.cluster.world) for c in candidates}
    multi_world = len(worlds) > len({t for t, _ in worlds})
    assessed = [assess(c, w) for c in candidates]
    rows = [a.row for a in assessed]
    pruned: Counter[str] = Counter()
    pruned[PRUNED_MEMORY] = sum(a.rate_bound is None for a in assessed)
    groups = [_groups(c, keep, plots, multi_world) for c in candidates]
    best: dict[tuple, list[float]] = {}  # group → min-heap of its K best simulated samples/s

    def below(k: int, ub: float) -> bool | None:
        """Is `ub` below the K-th best of every group of candidate k (None: a group lacks its K)?"""
        out = True
        for g, K in groups[k] or ():
            h = best.get(g, [])
            if len(h) < K:
                return None
            out = out and ub * (1 + SLACK) < h[0]
        return out

    def prunable(k: int) -> str | None:
        """The rule that prunes candidate k now, or None."""
        if groups[k] is None or assessed[k].rate_bound is None:
            return None
        first = below(k, assessed[k].rate_bound)
        if first:
            return PRUNED_COMPUTE
        if first is None:
            return None
        return PRUNED_CHAIN if below(k, chain_rate(candidates[k], w, algo)) else None

    def run(batch: list[int]) -> None:
        for k, r in zip(batch, simulate([candidates[k] for k in batch]), strict=True):
            rows[k] = r | {"pruned": ""}
            rate = r["samples_per_s"]
            if not r["fits"] or rate != rate or groups[k] is None:
                continue
            for g, K in groups[k]:
                h = best.setdefault(g, [])
                if len(h) < K:
                    heapq.heappush(h, rate)
                elif rate > h[0]:
                    heapq.heapreplace(h, rate)

    order = sorted((k for k in range(n) if assessed[k].rate_bound is not None), key=lambda k: -assessed[k].rate_bound)
    if progress:
        progress(0, n, 0.0)
    at, size = 0, ROUND
    while at < len(order):
        batch: list[int] = []
        while at < len(order) and len(batch) < size:
            k = order[at]
            at += 1
            rule = prunable(k)
            if rule:
                rows[k] = rows[k] | {"pruned": rule}
                pruned[rule] += 1
            else:
                batch.append(k)
        if batch:
            run(batch)
        done = n - (len(order) - at)
        if progress:
            progress(done, n, done / n)
    if multi_world:
        while more := _scaling_demand(rows):
            pruned.subtract(rows[k]["pruned"] for k in more)
            run(more)
    return rows, pruned


def _scaling_demand(rows: list[dict[str, Any]]) -> list[int]:
    """The bound-pruned rows the scaling columns and tables need: the base row (the smallest
    world) of every (topology, label) with a simulated row, and every row of the labels
    `plots.scaling_configs` shows (on the table as it stands: the pipelines it picks by their
    best samples/s are each cluster's leading ones, exact already)."""
    import pandas as pd

    from shardsim.simulator.sweep.plots import scaling_configs

    df = pd.DataFrame(rows)
    df["_k"] = range(len(df))
    need: set[int] = set()
    cut = df["pruned"].isin((PRUNED_COMPUTE, PRUNED_CHAIN))
    for _, g in df.groupby(["topology", "label"], sort=False):
        base = g.loc[g["world"].idxmin()]
        if base["pruned"] in (PRUNED_COMPUTE, PRUNED_CHAIN) and (g["pruned"] == "").any():
            need.add(int(base["_k"]))
    for _, g in df.groupby("topology", sort=False):
        if g["world"].nunique() > 1:
            shown = g[g["label"].isin(scaling_configs(g)) & cut[g.index]]
            need.update(int(k) for k in shown["_k"])
    return sorted(need)
