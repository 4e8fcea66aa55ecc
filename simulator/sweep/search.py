"""Sweep: every valid configuration of one scenario (or several clusters), predicted and ranked.

`sweep(base, space)` enumerates the strategies a cluster admits — ddp, zero, zero2d at
every degree that divides the world, pipelines at every valid degree × microbatch count ×
schedule, alone or with sharded stages — keeps those `resolve()` accepts, predicts each
(in parallel when it pays) and returns one pandas row per configuration, ranked.
`recommend(df)` names the `sharded_data_parallel_degree` and the configuration to use;
`scaling(df)` adds weak/strong scaling efficiency when the sweep spans several clusters.

Determinism: rows come out in the same order with the same values whatever the number of
workers (enumeration order, then a stable sort by rank); no timing goes into a row.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardsim.simulator.config import SCHEDULES, STRATEGIES, RunConfig, Strategy, resolve
from shardsim.simulator.errors import ConfigError
from shardsim.simulator.gcpause import paused_gc
from shardsim.simulator.hardware.topology import Cluster, InstanceType, make_cluster
from shardsim.simulator.workload.model import Workload, load_workload

if TYPE_CHECKING:  # pandas is imported when the first table is made (`_import_pandas`)
    import pandas as pd
    from shardsim.simulator.predict import StepPrediction

DATA_PARALLEL = ("ddp", "zero", "zero2d")  # the kinds a `sharded_data_parallel_degree` names
SERIAL_BELOW_S = 1.0  # estimated sweep work (s) under which a process pool is not worth starting
SECONDS_PER_COST = 2e-5  # `_cost_estimate` units → seconds of one core (rough, for that choice only)

# Columns of a sweep row, in order (the CSV/Parquet schema; `--json` rows have the same keys).
COLUMNS = (
    "topology",
    "nodes",
    "world",
    "device",
    "workload",
    "precision",
    "batch_per_device",
    "grad_accum",
    "global_batch",
    "config",
    "strategy",
    "degree",
    "pp",
    "microbatches",
    "schedule",
    "step_time_s",
    "samples_per_s",
    "compute_s",
    "exposed_comm_s",
    "bubble_s",
    "optimizer_s",
    "comm_total_s",
    "tflops_per_device",
    "mfu",
    "memory_per_rank_gib",
    "device_memory_gib",
    "mem_params_gib",
    "mem_grads_gib",
    "mem_optimizer_gib",
    "mem_gathered_gib",
    "mem_activations_gib",
    "mem_overhead_gib",
    "fits",
    "fit_reason",
    "cost_per_hour_usd",
    "cost_per_million_samples_usd",
    "rank",
)
SCALING_COLUMNS = ("scaling_mode", "scaling_base_gpus", "ideal_samples_per_s", "scaling_efficiency")


@dataclass(frozen=True)
class SweepSpace:
    """Which configurations to try. None means "all valid" for that axis.

    strategies: kinds to include (ddp, zero, zero2d, pipeline).
    degrees: shard degrees where a kind has a choice — zero2d's partition group size and a
      pipeline stage's shard degree (1 = unsharded stages). ddp (1) and zero (the world)
      have no choice and are kept whenever their kind is selected.
    pp: pipeline degrees; default every divisor of the world from 2 up to the layer count.
    microbatches: default pp, 2·pp, 4·pp where they divide the per-replica batch; given
      explicitly, every listed count that divides it.
    schedules: pipeline schedules (gpipe, 1f1b).
    topologies / nodes: the clusters (product of both); None = the base config's.
    global_batch: strong scaling — batch_per_device = global_batch / (world × grad_accum),
      clusters where it does not divide are skipped. None = weak scaling (fixed batch per device).
    """

    strategies: tuple[str, ...] = STRATEGIES
    degrees: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    microbatches: tuple[int, ...] | None = None
    schedules: tuple[str, ...] = SCHEDULES
    topologies: tuple[str | InstanceType, ...] | None = None
    nodes: tuple[int | None, ...] | None = None
    global_batch: int | None = None

    def __post_init__(self) -> None:
        for k in self.strategies:
            if k not in STRATEGIES:
                raise ConfigError(
                    f"unknown strategy {k!r}; expected some of {', '.join(STRATEGIES)}", field="strategies"
                )
        for s in self.schedules:
            if s not in SCHEDULES:
                raise ConfigError(f"unknown schedule {s!r}; expected some of {', '.join(SCHEDULES)}", field="schedules")
        for name in ("degrees", "pp", "microbatches", "nodes"):
            for v in getattr(self, name) or ():
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                    raise ConfigError(f"expected integers >= 1, got {v!r}", field=name)
        if self.global_batch is not None and (isinstance(self.global_batch, bool) or self.global_batch < 1):
            raise ConfigError(f"expected an integer >= 1, got {self.global_batch!r}", field="global_batch")
        for name in ("strategies", "schedules", "topologies", "nodes"):
            if getattr(self, name) is not None and not getattr(self, name):
                raise ConfigError("empty list", field=name)


@dataclass(frozen=True)
class Candidate:
    """One configuration to predict: a checked RunConfig on a known cluster."""

    index: int  # enumeration order (the deterministic tie-break)
    cfg: RunConfig  # normalized by resolve()
    cluster: Cluster
    cost_estimate: float  # relative cost of predicting it (for scheduling work on the pool)


@dataclass
class Enumeration:
    candidates: list[Candidate] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one line per cluster or axis value dropped


# -- enumeration ------------------------------------------------------------------------------


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_microbatches(pp: int, batch_per_device: int) -> list[int]:
    """pp, 2·pp, 4·pp microbatches where they divide the per-replica batch (batch_per_device × pp).

    Fewer than pp microbatches leave stages idle by construction; more than 4·pp buy a
    bubble under (pp-1)/(5·pp-1) at the price of tiny microbatches and, for sharded stages,
    one all-gather of every unit per microbatch — pass --microbatches to go further."""
    per_replica = batch_per_device * pp
    return [m for m in (pp, 2 * pp, 4 * pp) if per_replica % m == 0]


def _cost_estimate(cfg: RunConfig, n_layers: int) -> float:
    """Relative cost of one prediction (events in the simulation), for load balancing only."""
    s = cfg.strategy
    units = n_layers + 2
    if s.kind != "pipeline":
        return units * cfg.grad_accum * 3.0
    sharded = (s.degree or 1) > 1
    return s.microbatches * units * cfg.grad_accum * (4.0 if sharded else 1.5) * (1 + s.pp / 8)


def _clusters(base: RunConfig, space: SweepSpace) -> list[tuple[str | InstanceType, int | None]]:
    tops = space.topologies or (base.topology,)
    nodes = space.nodes or (base.nodes,)
    return [(t, n) for t in tops for n in nodes]


def _strategies_for(world: int, n_layers: int, batch_per_device: int, space: SweepSpace) -> Iterable[Strategy]:
    kinds = space.strategies
    sel = set(space.degrees) if space.degrees is not None else None
    if "ddp" in kinds:
        yield Strategy("ddp")
    if "zero" in kinds:
        yield Strategy("zero")
    if "zero2d" in kinds:
        # d = 1 is ddp; d = world is zero (resolve() says so): only when asked for by --degrees
        for d in sorted(sel) if sel is not None else divisors(world)[1:-1]:
            if d > 1:
                yield Strategy("zero2d", degree=d)
    if "pipeline" in kinds:
        pps = sorted(space.pp) if space.pp is not None else [p for p in divisors(world) if 2 <= p <= n_layers]
        for pp in pps:
            if pp < 2:
                continue  # a one-stage pipeline is data parallel: ddp/zero/zero2d cover it
            stage_ranks = world // pp if world % pp == 0 else 0
            ds = sorted(sel) if sel is not None else divisors(stage_ranks) if stage_ranks else [1]
            if space.microbatches is not None:
                ms = sorted(space.microbatches)
            else:
                ms = default_microbatches(pp, batch_per_device)
            for d in ds:
                for m in ms:
                    for sched in space.schedules:
                        yield Strategy("pipeline", degree=d, pp=pp, microbatches=m, schedule=sched)


def _check_cluster(cfg: RunConfig, cluster: Cluster) -> str | None:
    """Why a whole cluster is out (the checks predict() makes beyond resolve), or None."""
    dev = cluster.instance.device
    if not dev.supports(cfg.precision):
        return f"{dev.model} has no {cfg.precision} support (peak_tflops lists {', '.join(dev.peak_tflops)})"
    if cfg.backend == "nccl" and dev.kind == "cpu":
        return "nccl needs GPUs; this topology's devices are CPUs (use --backend gloo)"
    return None


def enumerate_configs(
    base: RunConfig, space: SweepSpace | None = None, workload: Workload | None = None
) -> Enumeration:
    """Every configuration of `space` that resolve() accepts, in a fixed order: clusters in the
    order given (topology, then nodes), then ddp, zero, zero2d by degree, pipelines by pp,
    shard degree, microbatches, schedule. Duplicates after normalization are dropped."""
    space = space or SweepSpace()
    w = workload or load_workload(base.workload)
    n_layers = len(w.layers) or len(w.blocks)
    out = Enumeration()
    seen: set[tuple] = set()
    for topology, nodes in _clusters(base, space):
        cluster = make_cluster(topology, nodes)
        name = f"{cluster.nodes} x {cluster.instance.name}"
        cfg0 = replace(base, topology=cluster.instance.path if isinstance(topology, InstanceType) else topology)
        cfg0 = replace(cfg0, nodes=cluster.nodes)
        if space.global_batch is not None:
            per = cluster.world * base.grad_accum
            if space.global_batch % per:
                out.skipped.append(
                    f"{name}: global batch {space.global_batch} does not divide over {cluster.world} devices"
                    + (f" x grad_accum {base.grad_accum}" if base.grad_accum > 1 else "")
                )
                continue
            cfg0 = replace(cfg0, batch_per_device=space.global_batch // per)
        why = _check_cluster(cfg0, cluster)
        if why:
            out.skipped.append(f"{name}: {why}")
            continue
        before = len(out.candidates)
        for strat in _strategies_for(cluster.world, n_layers, cfg0.batch_per_device, space):
            try:
                cfg, _ = resolve(replace(cfg0, strategy=strat), cluster.world, n_layers)
            except ConfigError:
                continue
            key = (cluster.instance.name, cluster.instance.path, cluster.nodes, cfg.strategy)
            if key in seen:
                continue
            seen.add(key)
            out.candidates.append(Candidate(len(out.candidates), cfg, cluster, _cost_estimate(cfg, n_layers)))
        if len(out.candidates) == before:
            out.skipped.append(f"{name}: no valid configuration in the requested space")
    return out


# -- prediction -------------------------------------------------------------------------------


def _row(c: Candidate, w: Workload, algo: str) -> dict[str, Any]:
    """One prediction as a sweep row. The cyclic garbage collector stays off until the
    prediction is freed (it makes no cycles): re-enabled in between, it would scan the plan's
    and the timeline's objects once or twice for nothing."""
    from shardsim.simulator.predict import predict  # the engine: imported here, and by the pool before it forks

    with paused_gc():
        return _row_of(c, predict(c.cfg, algo=algo, workload=w, cluster=c.cluster))


def _row_of(c: Candidate, p: StepPrediction) -> dict[str, Any]:
    s = c.cfg.strategy
    bd = p.breakdown
    m = p.memory
    price = p.cost_per_hour_usd
    per_million = price / 3600.0 / p.samples_per_s * 1e6 if price is not None and p.samples_per_s > 0 else None
    degree = {"ddp": 1, "zero": p.world}.get(s.kind, s.degree or 1)
    return {
        "topology": c.cluster.instance.name,
        "nodes": c.cluster.nodes,
        "world": p.world,
        "device": c.cluster.instance.device.model,
        "workload": c.cfg.workload,
        "precision": c.cfg.precision,
        "batch_per_device": c.cfg.batch_per_device,
        "grad_accum": c.cfg.grad_accum,
        "global_batch": p.global_batch,
        "config": s.label(),
        "strategy": s.kind,
        "degree": degree,
        "pp": s.pp,
        "microbatches": s.microbatches,
        "schedule": s.schedule if s.kind == "pipeline" else None,
        "step_time_s": p.step_time_s,
        "samples_per_s": p.samples_per_s,
        "compute_s": bd["compute_s"],
        "exposed_comm_s": bd["exposed_comm_s"],
        "bubble_s": bd["bubble_s"],
        "optimizer_s": bd["optimizer_s"],
        "comm_total_s": bd["comm_total_s"],
        "tflops_per_device": p.tflops_per_device,
        "mfu": p.mfu,
        "memory_per_rank_gib": p.memory_per_rank_gib,
        "device_memory_gib": p.device_memory_gib,
        "mem_params_gib": m["params_gib"],
        "mem_grads_gib": m["grads_gib"],
        "mem_optimizer_gib": m["optimizer_gib"],
        "mem_gathered_gib": m["gathered_gib"],
        "mem_activations_gib": m["activations_gib"],
        "mem_overhead_gib": m["overhead_gib"],
        "fits": bool(p.fits),
        "fit_reason": p.fit_reason,
        "cost_per_hour_usd": price,
        "cost_per_million_samples_usd": per_million,
    }


def _predict_task(task: tuple[int, Candidate, Workload, str]) -> tuple[int, dict[str, Any]]:
    i, c, w, algo = task
    return i, _row(c, w, algo)


def default_workers() -> int:
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
            rows[k] = _row(c, workload, algo)
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


# -- ranking, recommendation, scaling ---------------------------------------------------------


def _rank(df: pd.DataFrame) -> pd.DataFrame:
    """Rank within each cluster: fitting configurations first by samples/s (= by step time,
    the global batch being the same for every configuration of one cluster), then the ones
    that do not fit, by samples/s. Equal speed: less memory first (1F1B before GPipe when
    they tie), then the enumeration order."""
    df = df.copy()
    df["_order"] = range(len(df))
    df["_cluster"] = df.groupby(["topology", "nodes"], sort=False).ngroup()
    df = df.sort_values(
        ["_cluster", "fits", "samples_per_s", "memory_per_rank_gib", "_order"],
        ascending=[True, False, False, True, True],
        kind="mergesort",
    )
    df["rank"] = df.groupby("_cluster").cumcount() + 1
    return df.drop(columns=["_order", "_cluster"]).reset_index(drop=True)


def scaling(df: pd.DataFrame, mode: str | None = None) -> pd.DataFrame:
    """Scaling efficiency of each configuration across cluster sizes, per topology.

    efficiency(N) = (samples/s at N GPUs / N) / (samples/s at N0 / N0), N0 the smallest
    world where that configuration was predicted; the ideal line is samples/s(N0) · N/N0.
    mode: "weak" (fixed batch per device) or "strong" (fixed global batch); None infers it
    (strong when every row of a topology has the same global batch and worlds differ)."""
    df = df.copy()
    for col in SCALING_COLUMNS:
        df[col] = None if col == "scaling_mode" else float("nan")
    for _, idx in df.groupby(["topology", "config"], sort=False).groups.items():
        g = df.loc[idx]
        base = g.loc[g["world"].idxmin()]
        n0, s0 = float(base["world"]), float(base["samples_per_s"])
        ideal = s0 * g["world"] / n0
        df.loc[idx, "scaling_base_gpus"] = n0
        df.loc[idx, "ideal_samples_per_s"] = ideal
        df.loc[idx, "scaling_efficiency"] = g["samples_per_s"] / ideal
    for idx in df.groupby("topology", sort=False).groups.values():
        g = df.loc[idx]
        m = mode
        if m is None:
            m = "strong" if g["global_batch"].nunique() == 1 and g["world"].nunique() > 1 else "weak"
        df.loc[idx, "scaling_mode"] = m
    return df


def _summary(r: pd.Series | None) -> dict[str, Any] | None:
    if r is None:
        return None
    keys = (
        "topology",
        "nodes",
        "world",
        "config",
        "strategy",
        "degree",
        "pp",
        "microbatches",
        "schedule",
        "step_time_s",
        "samples_per_s",
        "memory_per_rank_gib",
        "fits",
        "cost_per_million_samples_usd",
    )
    return {k: _native(r[k]) for k in keys}


def _native(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item"):
        v = v.item()
        if isinstance(v, float) and math.isnan(v):
            return None
    return v


def _recommend_one(df: pd.DataFrame) -> dict[str, Any]:
    fit = df[df["fits"]].sort_values(
        ["samples_per_s", "memory_per_rank_gib"], ascending=[False, True], kind="mergesort"
    )
    if fit.empty:
        least = df.loc[df["memory_per_rank_gib"].idxmin()] if len(df) else None
        reason = "no configuration fits in memory"
        if least is not None:
            reason += (
                f" (the smallest, {least['config']}, needs {least['memory_per_rank_gib']:.1f} GiB per rank; "
                f"the device has {least['device_memory_gib']:g} GiB)"
            )
        return {
            "sharded_data_parallel_degree": None,
            "sdp": None,
            "best": None,
            "runner_up": None,
            "margin": None,
            "margin_over_sdp": None,
            "sdp_runner_up": None,
            "sdp_margin": None,
            "reason": reason,
        }
    best = fit.iloc[0]
    runner = fit.iloc[1] if len(fit) > 1 else None
    sdp = fit[fit["strategy"].isin(DATA_PARALLEL)]
    sdp_best = sdp.iloc[0] if len(sdp) else None
    sdp_runner = sdp.iloc[1] if len(sdp) > 1 else None

    def margin(a, b) -> float | None:
        return None if a is None or b is None else float(a["samples_per_s"] / b["samples_per_s"] - 1.0)

    return {
        "sharded_data_parallel_degree": None if sdp_best is None else int(sdp_best["degree"]),
        "sdp": _summary(sdp_best),
        "sdp_runner_up": _summary(sdp_runner),
        "sdp_margin": margin(sdp_best, sdp_runner),
        "best": _summary(best),
        "runner_up": _summary(runner),
        "margin": margin(best, runner),
        "margin_over_sdp": margin(best, sdp_best),  # best overall (a pipeline?) vs the best sdp row
        "reason": "",
    }


def recommend(df: pd.DataFrame) -> dict[str, Any]:
    """What to use. Never a configuration that does not fit.

    sharded_data_parallel_degree: the degree of the fastest fitting ddp (1) / zero (world) /
    zero2d (d) row; best: the fastest fitting row of any kind; margin: how much faster the
    best is than the runner-up (samples/s ratio - 1). Over several clusters, the overall
    answer is by samples/s, `cheapest` by cost per million samples, and `clusters` holds the
    answer for each cluster."""
    if df.empty:
        raise ConfigError("empty sweep: nothing to recommend")
    out = _recommend_one(df)
    clusters = list(df.groupby(["topology", "nodes"], sort=False))
    if len(clusters) > 1:
        out["clusters"] = [
            {"topology": top, "nodes": int(nodes), "world": int(g["world"].iloc[0]), **_recommend_one(g)}
            for (top, nodes), g in clusters
        ]
    priced = df[df["fits"] & df["cost_per_million_samples_usd"].notna()]
    out["cheapest"] = (
        _summary(priced.sort_values("cost_per_million_samples_usd", kind="mergesort").iloc[0]) if len(priced) else None
    )
    return out


# -- the sweep --------------------------------------------------------------------------------


def sweep(
    base: RunConfig | None = None,
    space: SweepSpace | None = None,
    *,
    workload: Workload | None = None,
    algo: str = "auto",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    skipped: list[str] | None = None,
) -> pd.DataFrame:
    """Predict every valid configuration of `space` around `base` (default: the seed scenario).

    Returns one row per configuration (columns `COLUMNS`, plus `SCALING_COLUMNS` when the
    sweep spans several cluster sizes), ranked within each cluster. Raises ConfigError when
    the space is empty; `skipped` (a list) receives one line per dropped cluster."""
    base = base or RunConfig()
    space = space or SweepSpace()
    w = workload or load_workload(base.workload)
    if base.profile:
        from shardsim.simulator.hardware.profile import load_profile

        load_profile(base.profile, w.name)  # a bad profile fails once, here, not in every worker
    en = enumerate_configs(base, space, w)
    if skipped is not None:
        skipped.extend(en.skipped)
    if not en.candidates:
        why = "; ".join(en.skipped[:3]) or "no strategy in the requested space is valid"
        raise ConfigError(f"empty sweep space after restrictions: {why}")
    rows = predict_all(en.candidates, w, algo=algo, workers=workers, progress=progress, meanwhile=_import_pandas)
    pd = _import_pandas()
    df = _rank(pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "rank"]))
    df = df[list(COLUMNS)]
    if df.groupby("topology")["world"].nunique().max() > 1:
        df = scaling(df, "strong" if space.global_batch is not None else "weak")
    return df


def _import_pandas():
    """pandas (a good part of a sweep's start-up), imported once the workers are predicting:
    the pool forks smaller processes, and this one imports it while it waits for them."""
    import pandas

    return pandas


def check_output_dir(out: str | Path) -> Path:
    """Make sure `out` is a writable folder before any prediction runs (ConfigError otherwise)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output folder {out} is a file, not a folder", field="--out")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".shardsim-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write to output folder {out}: {exc.strerror or exc}", field="--out") from None
    return path


def write_tables(df: pd.DataFrame, out: str | Path, stem: str = "sweep") -> list[Path]:
    """All rows to CSV and Parquet."""
    out = Path(out)
    csv, parquet = out / f"{stem}.csv", out / f"{stem}.parquet"
    df.to_csv(csv, index=False, float_format="%.6g")
    df.to_parquet(parquet, index=False)
    return [csv, parquet]


def to_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN → None, numpy scalars → Python)."""
    return [{k: _native(v) for k, v in r.items()} for r in df.to_dict(orient="records")]
