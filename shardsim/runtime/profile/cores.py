"""What the host's cores give the ranks computing at once (forked processes on copies of the
model, one torch thread each), and the yardstick: how fast the host is now, as all its cores are."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import statistics
import time
from collections.abc import Sequence

from shardsim.core.interrupts import worker_signals
from shardsim.runtime.emulation.hostspeed import QUIET_STEAL_SHARE, Probe, StealClock
from shardsim.runtime.processes import die_with_parent
from shardsim.runtime.profile.blocks import Bench, median_time, setup_bench

SHARING_ROUNDS_MAX = 6  # core-sharing rounds timed at most per rank count (3 quiet ones wanted)


def measure_core_sharing(workload: str, batch: int, ranks: Sequence[int], seconds: float = 0.6) -> dict[str, dict]:
    """What the host's cores give `n` processes computing at once, for each n in `ranks`.

    n forked processes, each on its own copy of the model (one torch thread), released
    together, run forward + backward iterations of the whole model, each after the host-speed
    probe, for a fixed wall time (about `seconds` of work each, alone):
    - `cpu_capacity`: the CPU seconds they got per wall second together while all of them
      ran (at most the core count: time slices lost to switching bring it below). A rate, not
      a fixed amount of work over the time until the last is done: the simulator shares the
      cores among the ranks computing at each moment, so the tail where fewer than the cores
      are still busy is its own to model (counted here too, it would be charged twice);
    - `probe_inflation`: the probe's CPU time among them over one process alone (caches and
      memory bandwidth are shared: the same work takes more CPU time);
    - `effective_cores`: capacity / inflation (at least 1), the cores' worth of work they get;
    - `steal_share`: the part of the host's cores' time the hypervisor took meanwhile
      (runtime.emulation.hostspeed.Steal), which the capacity has lost: a run in another share scales it.
    Each is the median of 3 rounds, each round timing the process alone just before: a
    capacity is a ratio taken at one moment, which this drifting host does not spoil. Rounds
    in which the hypervisor took more than QUIET_STEAL_SHARE of the cores are set aside and
    another is timed (at most SHARING_ROUNDS_MAX in all; if none was quiet, the median of all)."""
    ctx = _cpu_bench(workload)
    alone = median_time(_model_step(ctx, batch), 3, 1, lambda: None)
    iters = max(1, round(seconds / alone))
    out: dict[str, dict] = {"cpu_capacity": {}, "probe_inflation": {}, "effective_cores": {}, "steal_share": {}}
    clock = StealClock()
    for n in sorted(set(ranks)):
        rounds: list[tuple[float, float, float]] = []  # (capacity, inflation, steal share)
        while len(rounds) < SHARING_ROUNDS_MAX and sum(r[2] <= QUIET_STEAL_SHARE for r in rounds) < 3:
            _, _, probe_alone = _forked_cpu(ctx, batch, iters, 1)
            clock.start()
            capacity, probe = _forked_rate(ctx, batch, iters * alone * n / (os.cpu_count() or 1), n)
            steal = clock.stop()
            rounds.append((capacity, probe / probe_alone, steal.share if steal else 0.0))
        rounds = [r for r in rounds if r[2] <= QUIET_STEAL_SHARE] or rounds
        cap, inf, stolen = (statistics.median(r[k] for r in rounds) for k in range(3))
        out["cpu_capacity"][str(n)] = cap
        out["probe_inflation"][str(n)] = inf
        out["steal_share"][str(n)] = stolen
        # below 1 it is the host's drift between the two timings: sharing caches never speeds work up
        out["effective_cores"][str(n)] = cap / max(inf, 1.0)
    return out


def yardstick(workload: str, batch: int, *, iters: int = 3, rounds: int = 2) -> float:
    """How fast this host is right now, as all its cores are: one forked process per core, each
    on its own copy of the model, runs `iters` forward + backward passes of the whole model (one
    thread), released together; the wall time until all are done / `iters`, the mean of
    `rounds` such rounds.

    All cores, not one process alone: this shared VM's cores drift apart, each switching
    between about 0.33 and 0.47 s for the same pass within seconds (measured), so one process
    alone times whichever core it lands on. The ranks of an emulated cluster use every core."""
    ctx, procs = _cpu_bench(workload), os.cpu_count() or 1
    return statistics.fmean(_forked_cpu(ctx, batch, iters, procs, probed=False)[0] / iters for _ in range(rounds))


@functools.lru_cache(maxsize=4)
def _cpu_bench(workload: str) -> Bench:
    """The workload set up on the CPU, one thread, fp32: built once for core sharing and yardsticks."""
    return setup_bench(workload, "cpu", 1, "fp32")


def _forked_cpu(ctx: Bench, batch: int, iters: int, n: int, probed: bool = True) -> tuple[float, float, float]:
    """(wall seconds until all are done, their CPU seconds together, the probe's mean; NaN
    unless `probed`) of `n` forked processes, each on its own copy of the model, released
    together, each running a forward + backward `iters` times (after the probe, if `probed`)."""
    import multiprocessing as mp

    fork = mp.get_context("fork")
    barrier, results = fork.Barrier(n + 1), fork.Queue()
    args = (ctx, batch, iters, barrier, results, probed)
    with _workers(fork, _forked_worker, args, n) as procs:
        barrier.wait()
        t0 = time.perf_counter()
        got = [results.get() for _ in procs]
        wall = time.perf_counter() - t0
    return wall, sum(c for c, _ in got), statistics.fmean(p for _, p in got)


def _forked_rate(ctx: Bench, batch: int, seconds: float, n: int) -> tuple[float, float]:
    """(the CPU seconds per wall second `n` forked processes got together, the probe's mean):
    each on its own copy of the model, released together, each running the probe and a forward
    + backward in turn until `seconds` have passed, when it reads its CPU and wall clocks."""
    import multiprocessing as mp

    fork = mp.get_context("fork")
    barrier, results = fork.Barrier(n + 1), fork.Queue()
    with _workers(fork, _rate_worker, (ctx, batch, seconds, barrier, results), n) as procs:
        barrier.wait()
        got = [results.get() for _ in procs]
    return sum(cpu / wall for cpu, wall, _ in got), statistics.fmean(p for _, _, p in got)


@contextlib.contextmanager
def _workers(fork, target, args: tuple, n: int):
    """`n` forked processes running `target(*args)`, joined after the body; killed at once when it
    raises (a signal that ends the command is this process' to handle: they ignore Ctrl-C and
    SIGQUIT and end silently on SIGTERM and SIGHUP) and when this process dies."""
    procs = [fork.Process(target=_worker, args=(target, *args), daemon=True) for _ in range(n)]
    try:
        for p in procs:
            p.start()
        yield procs
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def _worker(target, *args) -> None:
    worker_signals()  # a signal to the process group ends the profile through this process, not here
    die_with_parent()
    target(*args)


def _rate_worker(ctx: Bench, batch: int, seconds: float, barrier, results) -> None:
    work, probe = _model_step(ctx, batch, private=True), Probe()
    work()
    read: list[float] = []

    def alarm(signum, frame) -> None:  # runs between two torch calls: the clocks are read at once
        read.extend((time.process_time() - c0, time.perf_counter() - t0))

    signal.signal(signal.SIGALRM, alarm)
    barrier.wait()
    t0, c0, probes = time.perf_counter(), time.process_time(), []
    signal.setitimer(signal.ITIMER_REAL, seconds)
    while not probes or not read:  # at least one probe, however short the time
        probes.append(probe())
        work()
    results.put((read[0], read[1], statistics.fmean(probes)))


def _forked_worker(ctx: Bench, batch: int, iters: int, barrier, results, probed: bool) -> None:
    work, probe = _model_step(ctx, batch, private=True), (Probe() if probed else None)
    work()
    barrier.wait()
    c0, probes = time.process_time(), []
    for _ in range(iters):
        if probe is not None:
            probes.append(probe())
        work()
    results.put((time.process_time() - c0, statistics.fmean(probes) if probes else math.nan))


def _model_step(ctx: Bench, batch: int, private: bool = False):
    """Forward + backward of the whole model. `private`: on a copy of the model and batch, so
    that a forked process works on memory of its own, as a rank does (pages shared with the
    parent would share the caches too and flatter the sharing)."""
    import copy

    import torch

    x, y = ctx.model.sample_batch(batch, generator=torch.Generator().manual_seed(0))
    model = copy.deepcopy(ctx.model) if private else ctx.model
    if private:
        x, y = x.clone(), y.clone()

    def step():
        model.loss(model(x), y).backward()
        model.zero_grad(set_to_none=True)

    return step
