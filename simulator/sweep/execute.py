"""Running the predictions of a sweep: serially, or on a pool of forked worker processes.

Determinism: rows come out in the candidates' order with the same values whatever the number
of workers; no timing goes into a row.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_all_start_methods, get_context
from typing import Any

from shardsim.simulator.gcpause import paused_gc
from shardsim.simulator.sweep.rows import row_of
from shardsim.simulator.sweep.space import Candidate
from shardsim.simulator.workload.model import Workload

SERIAL_BELOW_S = 1.0  # estimated sweep work (s) under which a process pool is not worth starting
SECONDS_PER_COST = 2e-5  # `Candidate.cost_estimate` units → seconds of one core (rough, for that choice only)


def predict_row(c: Candidate, w: Workload, algo: str) -> dict[str, Any]:
    """One prediction as a sweep row. The cyclic garbage collector stays off until the
    prediction is freed (it makes no cycles): re-enabled in between, it would scan the plan's
    and the timeline's objects once or twice for nothing."""
    from shardsim.simulator.predict import predict  # the engine: imported here, and by the pool before it forks

    with paused_gc():
        return row_of(c, predict(c.cfg, algo=algo, workload=w, cluster=c.cluster))


def _predict_task(task: tuple[int, Candidate, Workload, str]) -> tuple[int, dict[str, Any]]:
    i, c, w, algo = task
    return i, predict_row(c, w, algo)


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _pool(workers: int) -> ProcessPoolExecutor:
    # fork: workers inherit the loaded modules (the engine, imported once before the fork, not
    # once per worker). The pool is created and fed before any progress thread starts, so
    # nothing forks mid-thread.
    import shardsim.simulator.predict  # noqa: F401  (the engine and numpy, for every worker)

    ctx = get_context("fork") if "fork" in get_all_start_methods() else None
    return ProcessPoolExecutor(max_workers=workers, mp_context=ctx)


def predict_all(
    candidates: Sequence[Candidate],
    workload: Workload,
    *,
    algo: str = "auto",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> list[dict[str, Any]]:
    """Rows for the candidates, in their order. workers None: the machine's cores, serial when
    the estimated work is small; 1: serial; N > 1: a pool of N processes, fed the most
    expensive predictions first (rows are placed by index, so the order never changes).
    `meanwhile()` runs here once the predictions are under way (with a pool: while it works)."""
    n = len(candidates)
    est = sum(c.cost_estimate for c in candidates) * SECONDS_PER_COST  # ~seconds on one core (rough)
    serial = workers is None and est < SERIAL_BELOW_S  # workers=N (N > 1) forces the pool
    workers = default_workers() if workers is None else max(1, workers)
    rows: list[dict[str, Any] | None] = [None] * n
    if workers == 1 or n < 2 or serial:
        if meanwhile:
            meanwhile()
        for k, c in enumerate(candidates):
            rows[k] = predict_row(c, workload, algo)
            if progress:
                progress(k + 1, n)
        return rows  # type: ignore[return-value]
    order = sorted(range(n), key=lambda k: (-candidates[k].cost_estimate, k))
    pool = _pool(min(workers, n))
    try:
        # every worker is forked at the first submit, before `progress` can start a thread
        futures = [pool.submit(_predict_task, (k, candidates[k], workload, algo)) for k in order]
        if meanwhile:
            meanwhile()
        for done, fut in enumerate(as_completed(futures), start=1):
            k, row = fut.result()
            rows[k] = row
            if progress:
                progress(done, n)
    except BaseException:  # an error or Ctrl-C: do not wait for the rest of the sweep
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return rows  # type: ignore[return-value]
