"""Running the predictions of a sweep: serially, on a pool of forked worker processes, or on Ray
(`ray_executor`); the rows a result cache holds (`cache`) are served from it, not predicted.

Determinism: rows come out in the candidates' order with the same values whatever the number
of workers; no timing goes into a row.

Interrupts: the workers ignore SIGINT (a terminal's Ctrl-C reaches the whole process group),
so only this process sees it; on it, or on any error, the workers are killed at once, not
waited for, and the kernel kills any left when this process ends, however it ends (Linux).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import active_children, get_all_start_methods, get_context
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from shardsim.core import interrupts
from shardsim.specs.model.workload import Workload
from shardsim.sweep.space import Candidate
from shardsim.sweep.task import default_workers, predict_row

if TYPE_CHECKING:
    from shardsim.sweep.cache import ResultCache
    from shardsim.sweep.ray_executor import RayExecutor

SERIAL_BELOW_S = 1.0  # estimated sweep work (s) under which a process pool is not worth starting
SECONDS_PER_COST = 7e-6  # `Candidate.cost_estimate` units → seconds of one core (rough, for that choice only)


def _predict_task(task: tuple[int, Candidate, Workload, str]) -> tuple[int, dict[str, Any]]:
    i, c, w, algo = task
    return i, predict_row(c, w, algo)


def estimated_seconds(candidates: Sequence[Candidate], workers: int | None = None) -> float:
    """About how long predicting `candidates` takes on `workers` processes (default: the machine's
    cores) of an idle machine: their estimated cost, shared evenly (rough)."""
    total = sum(c.cost_estimate for c in candidates) * SECONDS_PER_COST
    return total / max(1, min(workers or default_workers(), len(candidates)))


def _pool(workers: int) -> ProcessPoolExecutor:
    # fork: workers inherit the loaded modules (the engine, imported once before the fork, not
    # once per worker). Every worker is forked at the first submit, before any progress thread starts.
    import shardsim.simulator.predict  # noqa: F401  (the engine and numpy, for every worker)

    ctx = get_context("fork") if "fork" in get_all_start_methods() else None
    # each worker ignores Ctrl-C and dies with this process, however it ends (`worker_signals`)
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=interrupts.worker_signals, initargs=(os.getpid(),)
    )


def _stop(pool: ProcessPoolExecutor, others: set[BaseProcess]) -> None:
    """End the pool now: cancel what has not started and kill its workers, every child process
    but `others` (those that ran before the pool), however far it got starting them (a
    prediction cannot be interrupted, and the executor would otherwise wait for those under way
    at exit)."""
    pool.shutdown(wait=False, cancel_futures=True)
    workers = [p for p in active_children() if p not in others]
    for worker in workers:
        worker.kill()
    for worker in workers:
        worker.join()


def predict_all(
    candidates: Sequence[Candidate],
    workload: Workload,
    *,
    algo: str = "auto",
    workers: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    meanwhile: Callable[[], object] | None = None,
    cache: ResultCache | None = None,
    executor: RayExecutor | None = None,
) -> list[dict[str, Any]]:
    """Rows for the candidates, in their order. With a `cache`, the rows it holds are served from
    it and only the others are predicted, each stored as soon as it is (`cache.hits`,
    `cache.simulated` count them). The predictions run on `executor` (a `RayExecutor`) or here:
    workers None: the machine's cores, serial when the estimated work is small; 1: serial; N > 1:
    a pool of N processes, fed the most expensive predictions first (rows are placed by index, so
    the order never changes). `meanwhile()` runs here once the predictions are under way (with a
    pool: while it works); `progress(done, n, work)` once the workers exist (done 0), then after
    each prediction, `n` the predictions to make (the cache's rows are not counted), `work` the
    share of their estimated cost done."""
    n = len(candidates)
    rows: list[dict[str, Any] | None] = [None] * n
    keys: list[str | None] = [None] * n
    if cache is not None:
        from shardsim.sweep.cache import cached_rows

        keys, held = cached_rows(cache, candidates, workload, algo)
        for k, row in held.items():
            rows[k] = row
    todo = [k for k in range(n) if rows[k] is None]

    def done(k: int, row: dict[str, Any]) -> None:
        rows[k] = row
        if cache is not None:
            cache.store(keys[k], row)  # before `progress` hears of it: an interrupt keeps it
            cache.simulated += 1

    if not todo:
        if meanwhile:
            meanwhile()
    elif executor is not None:
        executor.predict([candidates[k] for k in todo], todo, workload, algo, done, progress, meanwhile)
    else:
        _predict_here([candidates[k] for k in todo], todo, workload, algo, workers, done, progress, meanwhile)
    return rows  # type: ignore[return-value]


def _predict_here(
    cands: Sequence[Candidate],
    index: Sequence[int],
    workload: Workload,
    algo: str,
    workers: int | None,
    done: Callable[[int, dict[str, Any]], None],
    progress: Callable[[int, int, float], None] | None,
    meanwhile: Callable[[], object] | None,
) -> None:
    """`predict_all`'s local executor: `done(index[i], row)` for each of `cands`, serially or on a pool."""
    n = len(cands)
    total = sum(c.cost_estimate for c in cands)
    est = total * SECONDS_PER_COST  # ~seconds on one core (rough)
    spent = 0.0
    serial = workers is None and est < SERIAL_BELOW_S  # workers=N (N > 1) forces the pool
    workers = default_workers() if workers is None else max(1, workers)
    if workers == 1 or n < 2 or serial:
        if meanwhile:
            meanwhile()
        if progress:
            progress(0, n, 0.0)
        for i, c in enumerate(cands):
            done(index[i], predict_row(c, workload, algo))
            spent += c.cost_estimate
            if progress:
                progress(i + 1, n, spent / total if total > 0 else (i + 1) / n)
        return
    order = sorted(range(n), key=lambda i: (-cands[i].cost_estimate, i))
    others = set(active_children())
    pool = _pool(min(workers, n))
    try:
        with interrupts.held():  # the workers are forked at the first submit
            futures = [pool.submit(_predict_task, (i, cands[i], workload, algo)) for i in order]
        if progress:
            progress(0, n, 0.0)  # the workers exist: a progress thread may start
        if meanwhile:
            meanwhile()
        for finished, fut in enumerate(as_completed(futures), start=1):
            i, row = fut.result()
            done(index[i], row)
            spent += cands[i].cost_estimate
            if progress:
                progress(finished, n, spent / total if total > 0 else finished / n)
    except BaseException:  # an error or Ctrl-C: kill the workers, do not wait for the rest of the sweep
        _stop(pool, others)
        raise
    pool.shutdown()


class Workers:
    """Local worker processes kept for several batches of tasks (the pruned search's rounds): forked
    at the first batch, killed at the end, on an error or on Ctrl-C (not waited for). With one
    worker the tasks run here, one after another."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._pool: ProcessPoolExecutor | None = None
        self._others: set[BaseProcess] = set()  # the child processes that ran before the pool

    def map(
        self, fn: Callable[[Any], Any], tasks: Sequence[Any], meanwhile: Callable[[], object] | None = None
    ) -> list[Any]:
        """`fn(task)` for each task, results in the tasks' order; `meanwhile()` runs here while the
        workers work (first, without workers)."""
        if self.workers == 1 or len(tasks) < 2:
            if meanwhile:
                meanwhile()
            return [fn(t) for t in tasks]
        try:
            if self._pool is None:
                self._others = set(active_children())
                self._pool = _pool(self.workers)
            with interrupts.held():  # the workers are forked at the first submit
                futures = [self._pool.submit(fn, t) for t in tasks]
            if meanwhile:
                meanwhile()
            return [f.result() for f in futures]
        except BaseException:
            self.close(kill=True)
            raise

    def close(self, kill: bool = False) -> None:
        if self._pool is not None:
            if kill:
                _stop(self._pool, self._others)
            else:
                self._pool.shutdown()
            self._pool, self._others = None, set()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(kill=exc_type is not None)
