"""The sweep end to end: every valid configuration of one scenario (or several clusters),
enumerated, predicted (in parallel when it pays) and ranked, as one pandas table, with the
recommendation over it and what the space held that was left out.

Determinism: the same rows in the same order whatever the number of workers (enumeration
order, then a stable sort by rank); no timing goes into a row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.model.workload import Workload
from shardsim.sweep.execute import SERIAL_BELOW_S, Workers, estimated_seconds, predict_all
from shardsim.sweep.ranking import rank, scaling
from shardsim.sweep.recommendation import Recommendation, recommend
from shardsim.sweep.rows import columns, with_pruned
from shardsim.sweep.space import SweepSpace, dropped_line, enumerate_configs
from shardsim.sweep.task import default_workers

if TYPE_CHECKING:  # pandas is imported when the first table is made (`_import_pandas`)
    import pandas as pd

    from shardsim.sweep.cache import ResultCache
    from shardsim.sweep.ray_executor import RayExecutor


@dataclass(frozen=True, eq=False)  # a table has no truth value: results compare by identity
class SweepResult:
    """What a sweep found.

    table: one row per configuration predicted, ranked within each cluster (columns
      `rows.columns()`; `SCALING_COLUMNS` too when the sweep spans several cluster sizes);
    recommendation: `recommend(table)`;
    skipped: one line per cluster (or axis value) left out whole, with the reason;
    dropped: configurations of the clusters kept that the simulator cannot do, how many for
      each reason, in the order first met;
    dropped_kinds: the same configurations, how many for each kind of reason (`space.OVER_OP_BOUND`,
      `space.INVALID_LAYOUT`, `space.NO_PRECISION`);
    pruned: configurations not simulated, how many by each rule (`prune.PRUNED_MEMORY`: does
      not fit; `prune.PRUNED_COMPUTE`: its compute bound says it cannot matter); empty when the
      search was exhaustive (its unfit rows are not simulated either).
    """

    table: pd.DataFrame
    recommendation: Recommendation
    skipped: tuple[str, ...] = ()
    dropped: dict[str, int] = field(default_factory=dict)
    pruned: dict[str, int] = field(default_factory=dict)
    dropped_kinds: dict[str, int] = field(default_factory=dict)
    library: str = "pytorch"  # the training library the sweep predicted (the model's error is the device's with it)

    def dropped_line(self) -> str | None:
        """One line: how many configurations were dropped, by kind of reason (None when none was)."""
        return dropped_line(self.dropped_kinds)

    def pruned_line(self) -> str | None:
        """One line: how many were simulated and how many pruned by which rule (None when no bound pruned any)."""
        if not any(v for k, v in self.pruned.items() if k != "memory"):
            return None
        n = len(self.table)
        cut = ", ".join(f"{k} {v}" for k, v in self.pruned.items())
        return f"pruned search: {n - sum(self.pruned.values())} of {n} configurations simulated; pruned by {cut}"


def sweep(
    base: RunConfig | None = None,
    space: SweepSpace | None = None,
    *,
    workload: Workload | None = None,
    algo: str = "auto",
    workers: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    confirm: Callable[[int, float], None] | None = None,
    prune: bool = False,
    keep: int = 2,
    plots: bool = False,
    cache: ResultCache | None = None,
    executor: RayExecutor | None = None,
) -> SweepResult:
    """Predict every valid configuration of `space` around `base` (default: the seed scenario),
    rank them and recommend one (`SweepResult`).

    The table has one row per configuration (columns `columns()`: `COLUMNS`, with
    `SETTING_COLUMNS` when the space lists settings; plus `SCALING_COLUMNS` when the sweep spans
    several cluster sizes), ranked within each cluster. Raises ConfigError when the space is
    empty. `confirm(n, seconds)` is called with the number of configurations and the estimated
    time before any is predicted (it raises to stop the sweep). `cache` and `executor`: as
    `predict_all` takes them (rows served from a result cache; predictions on Ray).

    `prune`: the pruned search (`prune.pruned_rows`: memory, then the compute bound,
    then simulation best-first): the recommendation, each cluster's `keep` leading rows and (with
    `plots`) the rows the plots draw are those of the exhaustive search; the rows pruned keep
    their memory, with NaN times and the rule in a `pruned` column. False: every fitting
    configuration simulated, and no `pruned` column (the default)."""
    base = base or RunConfig()
    space = space or SweepSpace()
    w = workload or load_workload(base.workload, base.shape, base.source)
    if base.profile:
        from shardsim.simulator.hardware.profile import load_profile

        load_profile(base.profile, w.name)  # a bad profile fails once, here, not in every worker
    if base.calibration:
        from shardsim.simulator.calibration.apply import load_calibration

        load_calibration(base.calibration)  # read (and a forced one told) once, before the workers fork
    en = enumerate_configs(base, space, w)
    if not en.candidates:
        more = len(en.skipped) - 3
        why = "; ".join(en.skipped[:3]) + (f"; and {more} more clusters" if more > 0 else "")
        raise ConfigError(f"empty sweep space, no valid configuration in the requested space: {why}")
    if confirm is not None:
        confirm(len(en.candidates), estimated_seconds(en.candidates, workers))
    cols = columns(space.spans_settings)
    counts: dict[str, int] = {}
    if prune:
        from shardsim.sweep.prune import ExecutorRunner, LocalRunner, pruned_rows

        if executor is not None:

            def simulate(batch):
                return predict_all(batch, w, algo=algo, cache=cache, executor=executor)

            runner = ExecutorRunner(simulate, w, algo)
            rows, by_rule = pruned_rows(en.candidates, runner, keep=keep, plots=plots, progress=progress)
        else:
            small = workers is None and estimated_seconds(en.candidates, 1) < SERIAL_BELOW_S
            with Workers(1 if small else workers or default_workers()) as pool:
                runner = LocalRunner(pool, w, algo, cache, meanwhile=_import_pandas)
                rows, by_rule = pruned_rows(en.candidates, runner, keep=keep, plots=plots, progress=progress)
        counts = dict(by_rule)
        cols = with_pruned(cols)
    else:
        rows = predict_all(
            en.candidates,
            w,
            algo=algo,
            workers=workers,
            progress=progress,
            meanwhile=_import_pandas,
            cache=cache,
            executor=executor,
        )
    pd = _import_pandas()
    df = rank(pd.DataFrame(rows, columns=[c for c in cols if c != "rank"]))
    df = df[list(cols)]
    if df.groupby("topology")["world"].nunique().max() > 1:
        df = scaling(df, "strong" if space.global_batch is not None else "weak")
    rec = recommend(df, base.library)
    if rec.best is None:  # nothing fits: what would make the smallest configuration fit
        from shardsim.sweep.hints import fit_hint

        least = en.candidates[min(range(len(rows)), key=lambda k: rows[k]["memory_required_gib"])]
        rec["hint"] = fit_hint(least.cfg, least.cluster, w, space.global_batch)
    return SweepResult(df, rec, tuple(en.skipped), dict(en.dropped), counts, dict(en.dropped_kinds), base.library)


def _import_pandas():
    """pandas (a good part of a sweep's start-up), imported once the workers are predicting:
    the pool forks smaller processes, and this one imports it while it waits for them."""
    import pandas

    return pandas
