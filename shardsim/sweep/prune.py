"""The pruned search: every configuration assessed without simulation first (memory, then a
lower bound of its step time, `bounds`), then simulated best-first (highest bound on samples/s
first) in rounds, skipping those that can no longer matter.

What stays exact (identical to simulating everything; `tests/test_sweep_prune.py` compares):
each cluster's `keep` leading rows (rank and figures: the recommendation's best and runner-up,
and the report's `--top` rows), the two leading data-parallel rows (the recommended degree and
its runner-up), the cheapest (a cluster's price is the same for all its rows: its fastest is
its cheapest), and with `plots` the rows the plots draw (each cluster's best pipeline per pp and
best layout per tensor-parallel degree, and its `ranking.MAX_BARS` leading pipelines), and over several
cluster sizes each cluster's `SCALING_LINES` leading rows of those that may be pruned (so the
scaling tables pick the lines the exhaustive search would: `ranking.scaling_configs`). Never pruned:
the ddp/zero/zero2d rows without tensor parallelism (the plots and the scaling tables show
each), and on demand the rows the scaling columns and tables need (`_scaling_demand`).

A row pruned keeps its memory and fit, with NaN times; its `pruned` column names the rule,
`bound_step_s` the lower bound on its step time that put it out (the rate bound's), and
`pruned_by` the configuration whose simulated rate it could not reach (the K-th best of its group):
- `PRUNED_MEMORY` ("memory"): it does not fit (as an exhaustive sweep does too: not simulated);
- `PRUNED_COMPUTE` ("compute bound"): global batch / compute bound (an upper bound on its
  samples/s) is below the `K`-th best samples/s already simulated in every group it belongs to
  (the rows never pruned count toward it too);
- `PRUNED_CHAIN` ("chain bound"): the same with the dependency-chain bound
  (`engine.chain_bound`: its plan built, every collective alone on the network, or its busiest
  link, not simulated), tried only where the compute bound did not prune and every group has its
  K best already; it runs where the simulation would, which then reuses the plan.

Where the work runs: the assessment and each round's chain bounds and simulations on the local
workers (`execute.Workers`, forked once for the whole search), or, with Ray, the simulations on
Ray and the rest here. Each round is decided on the K-th bests of the rounds before it, so the
rows are the same whatever the number of workers. With a result cache, a row it holds is taken
as simulated (no bound tried), so a repeated search may hold more simulated rows than the first.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardsim.specs.model.workload import Workload
from shardsim.sweep.execute import Workers
from shardsim.sweep.ranking import MAX_BARS, SCALING_LINES, scaling_configs
from shardsim.sweep.space import Candidate

if TYPE_CHECKING:
    from shardsim.sweep.cache import ResultCache

PRUNED_MEMORY = "memory"
PRUNED_COMPUTE = "compute bound"
PRUNED_CHAIN = "chain bound"
SLACK = 1e-9  # relative: a bound within this of the K-th best is not pruned (float rounding of both)
ROUND = 16  # candidates simulated per round (one `predict_all` call): the same whatever the workers, so are the rows


@dataclass
class Assessed:
    """A candidate before simulation: its row without times, and the upper bound on its samples/s
    (None when it does not fit)."""

    row: dict[str, Any]
    rate_bound: float | None


def assess(c: Candidate, w: Workload, algo: str = "auto") -> Assessed:
    """Memory first (no plan), then the compute bound (`bounds.compute_bound_s`)."""
    from shardsim.simulator.bounds import compute_bound_s
    from shardsim.simulator.predict import prepare
    from shardsim.sweep.rows import row_of

    s = prepare(c.cfg, workload=w, cluster=c.cluster)
    row = row_of(c, s.unsimulated(config=False))  # a row holds no configuration dict
    if not s.fits:
        return Assessed(row | {"pruned": PRUNED_MEMORY, "bound_step_s": float("nan"), "pruned_by": ""}, None)
    bound = compute_bound_s(s, algo)
    return Assessed(
        row | {"bound_step_s": float("nan"), "pruned_by": ""}, s.res.global_batch / bound if bound > 0 else float("inf")
    )


def _rate(global_batch: int, bound_s: float) -> float:
    return global_batch / bound_s if bound_s > 0 else float("inf")


def chain_rate(c: Candidate, w: Workload, algo: str) -> float:
    """global batch / the dependency-chain bound of `c` (`predict.chain_bound_s`): an upper bound on its samples/s."""
    from shardsim.simulator.predict import chain_bound_s, prepare

    s = prepare(c.cfg, workload=w, cluster=c.cluster)
    return _rate(s.res.global_batch, chain_bound_s(s, algo))


def bounded_row(c: Candidate, w: Workload, algo: str, limit: float | None) -> dict[str, Any] | float:
    """`c`'s row, simulated, or the chain bound's samples/s when `limit` is given and that is below
    it: its plan is built once, for the bound and then the simulation."""
    from shardsim.simulator.gcpause import paused_gc
    from shardsim.simulator.predict import chain_bound_s, prepare
    from shardsim.sweep.rows import row_of

    with paused_gc():
        s = prepare(c.cfg, workload=w, cluster=c.cluster)
        plan = s.plan()
        if limit is not None:
            rate = _rate(s.res.global_batch, chain_bound_s(s, algo, plan))
            if rate * (1 + SLACK) < limit:
                return rate
        return row_of(c, s.simulated(plan, algo))


def _assess_chunk(task: tuple[Sequence[Candidate], Workload, str]) -> list[Assessed]:
    cands, w, algo = task
    return [assess(c, w, algo) for c in cands]


def _bounded_task(task: tuple[Candidate, Workload, str, float | None]) -> dict[str, Any] | float:
    return bounded_row(*task)


ASSESS_CHUNK = 32  # candidates a worker assesses per task (each a few ms: one task each would be mostly overhead)


@dataclass
class LocalRunner:
    """The pruned search's work on `execute.Workers`, with the rows a result cache holds served
    from it (a row simulated is stored as soon as its round is done)."""

    workers: Workers
    w: Workload
    algo: str
    cache: ResultCache | None = None
    meanwhile: Callable[[], object] | None = None  # runs here while the workers assess

    def assess(self, cands: Sequence[Candidate]) -> list[Assessed]:
        chunks = [cands[i : i + ASSESS_CHUNK] for i in range(0, len(cands), ASSESS_CHUNK)]
        tasks = [(c, self.w, self.algo) for c in chunks]
        return [a for part in self.workers.map(_assess_chunk, tasks, self.meanwhile) for a in part]

    def run(self, cands: Sequence[Candidate], limits: Sequence[float | None]) -> list[dict[str, Any] | float]:
        """Each candidate's row, simulated, or the chain bound's samples/s that pruned it."""
        out: list[dict[str, Any] | float | None] = [None] * len(cands)
        keys: list[str | None] = [None] * len(cands)
        if self.cache is not None:
            from shardsim.sweep.cache import cached_rows

            keys, held = cached_rows(self.cache, cands, self.w, self.algo)
            for k, row in held.items():
                out[k] = row
        todo = [k for k in range(len(cands)) if out[k] is None]
        todo.sort(key=lambda k: -cands[k].cost_estimate)  # the longest first: the round ends sooner
        tasks = [(cands[k], self.w, self.algo, limits[k]) for k in todo]
        for k, row in zip(todo, self.workers.map(_bounded_task, tasks), strict=True):
            out[k] = row
            if isinstance(row, dict) and self.cache is not None:
                self.cache.store(keys[k], row)
                self.cache.simulated += 1
        return out  # type: ignore[return-value]  # every entry set


@dataclass
class ExecutorRunner:
    """The pruned search with its simulations on an executor (Ray, `predict_all`): assessment and
    chain bounds here."""

    simulate: Callable[[Sequence[Candidate]], list[dict[str, Any]]]
    w: Workload
    algo: str

    def assess(self, cands: Sequence[Candidate]) -> list[Assessed]:
        return [assess(c, self.w, self.algo) for c in cands]

    def run(self, cands: Sequence[Candidate], limits: Sequence[float | None]) -> list[dict[str, Any] | float]:
        """Each candidate's row, simulated, or the chain bound's samples/s that pruned it."""
        out: list[dict[str, Any] | float] = [0.0] * len(cands)
        keep = []
        for k, lim in enumerate(limits):
            rate = None if lim is None else chain_rate(cands[k], self.w, self.algo)
            if rate is not None and rate * (1 + SLACK) < lim:  # type: ignore[operator]
                out[k] = rate
            else:
                keep.append(k)
        for k, row in zip(keep, self.simulate([cands[k] for k in keep]), strict=True):
            out[k] = row
        return out


def _groups(c: Candidate, keep: int, plots: bool, multi_world: bool) -> tuple[list[tuple[tuple, int]], bool]:
    """The ranking groups `c` belongs to, each with how many of its leading configurations (by
    label: a group over several clusters ranks a label by its best row) must be exact, and
    whether `c` may be pruned (the plain ddp/zero/zero2d rows never are: the plots and the
    scaling tables show each; their rates still count toward the K-th best of their groups)."""
    s = c.cfg.strategy
    cluster = (c.cluster.instance.name, c.cluster.nodes)
    pipeline = s.spec.is_pipeline
    out: list[tuple[tuple, int]] = [((cluster, "all"), keep)]
    if not pipeline:
        out.append(((cluster, "sdp"), 2))
    if not pipeline and s.tp == 1:
        return out, False
    if multi_world:  # the scaling table's lines beyond the plain ddp/zero/zero2d ones (`ranking.scaling_configs`):
        # its topology's configurations by their best samples/s over the cluster sizes
        out.append(((c.cluster.instance.name, "scaling"), SCALING_LINES))
    if plots and pipeline:  # `plots.plot_throughput_cost`'s leading pipelines (at most MAX_BARS)
        out.append(((cluster, "pipelines"), MAX_BARS))
    if plots and pipeline and s.tp == 1:
        out.append(((cluster, "pp", s.pp), 1))
    if plots and s.tp > 1:
        out.append(((cluster, "tp", s.tp), 1))
    return out, True


def pruned_rows(
    candidates: Sequence[Candidate],
    runner: LocalRunner | ExecutorRunner,
    *,
    keep: int = 2,
    plots: bool = False,
    progress: Callable[[int, int, float], None] | None = None,
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Rows for `candidates` in their order (each with a `pruned` column: "" when simulated), and
    how many were pruned by each rule; `runner` assesses and simulates them."""
    n = len(candidates)
    worlds = {(c.cluster.instance.name, c.cluster.world) for c in candidates}
    multi_world = len(worlds) > len({t for t, _ in worlds})
    if progress:
        progress(0, n, 0.0)
    assessed = runner.assess(candidates)
    rows = [a.row for a in assessed]
    pruned: Counter[str] = Counter()
    pruned[PRUNED_MEMORY] = sum(a.rate_bound is None for a in assessed)
    groups, prunable = zip(*(_groups(c, keep, plots, multi_world) for c in candidates), strict=True) if n else ((), ())
    best: dict[tuple, dict[str, float]] = {}  # group → each label's best simulated samples/s
    kth: dict[tuple, tuple[float, str]] = {}  # group → its K-th best label's rate and label (read between rounds)

    def limit_by(k: int) -> tuple[float, str] | None:
        """The samples/s that candidate k's upper bound must reach to matter, and the label that
        set it: the lowest K-th best of its groups (None: never pruned, or a group lacks its K)."""
        if not prunable[k]:
            return None
        out = (float("inf"), "")
        for g, _ in groups[k]:
            if g not in kth:
                return None
            out = min(out, kth[g], key=lambda v: v[0])
        return out

    def limit(k: int) -> float | None:
        lb = limit_by(k)
        return None if lb is None else lb[0]

    def cut(k: int, rule: str, rate: float) -> None:
        """Row k pruned by `rule`, its rate bound `rate` below the limit `limit_by(k)` names."""
        lb = limit_by(k)
        bound = rows[k]["global_batch"] / rate if rate > 0 else 0.0
        rows[k] = rows[k] | {"pruned": rule, "bound_step_s": bound, "pruned_by": lb[1] if lb else ""}
        pruned[rule] += 1

    def run(batch: list[int], limits: list[float | None]) -> None:
        for k, r in zip(batch, runner.run([candidates[k] for k in batch], limits), strict=True):
            if not isinstance(r, dict):
                cut(k, PRUNED_CHAIN, r)
                continue
            rows[k] = r | {"pruned": "", "bound_step_s": float("nan"), "pruned_by": ""}
            rate = r["samples_per_s"]
            if not r["fits"] or rate != rate:
                continue
            for g, K in groups[k]:
                labels = best.setdefault(g, {})
                labels[candidates[k].label] = max(rate, labels.get(candidates[k].label, rate))
                if len(labels) >= K:
                    label, rate_k = heapq.nlargest(K, labels.items(), key=lambda kv: kv[1])[-1]
                    kth[g] = (rate_k, label)

    queue = deque(
        sorted((k for k in range(n) if assessed[k].rate_bound is not None), key=lambda k: -assessed[k].rate_bound)
    )
    while queue:
        batch: list[int] = []
        limits: list[float | None] = []
        later: list[int] = []  # waits for a round that knows the K-th best of a group it would fill
        filling: Counter[tuple] = Counter()  # this round's candidates toward each group still short of its K
        while queue and len(batch) < ROUND:
            k = queue.popleft()
            lim = limit(k)
            if lim is not None and assessed[k].rate_bound * (1 + SLACK) < lim:  # type: ignore[operator]
                cut(k, PRUNED_COMPUTE, assessed[k].rate_bound)  # type: ignore[arg-type]
                continue
            short = [g for g, K in groups[k] if g not in kth]
            if lim is None and prunable[k]:
                if any(len(best.get(g, ())) + filling[g] >= K for g, K in groups[k] if g in short):
                    later.append(k)  # enough of this group's are under way to set its K-th best
                    continue
            filling.update(short)
            batch.append(k)
            limits.append(lim)
        queue.extendleft(reversed(later))
        if batch:
            run(batch, limits)
        done = n - len(queue)
        if progress:
            progress(done, n, done / n)
    if multi_world:
        while more := _scaling_demand(rows):
            pruned.subtract(rows[k]["pruned"] for k in more)
            run(more, [None] * len(more))
    return rows, pruned


def _scaling_demand(rows: list[dict[str, Any]]) -> list[int]:
    """The bound-pruned rows the scaling columns and tables need: the base row (the smallest
    world) of every (topology, label) with a simulated row, and every row of the labels
    `ranking.scaling_configs` shows (on the table as it stands: the lines it picks by their best
    samples/s are among their clusters' leading ones, exact already)."""
    import pandas as pd

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
