"""`shardsim collective`: one collective on a cluster, timed by the simpy network."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import simpy

from shardsim.core.errors import ConfigError
from shardsim.simulator.network.alltoall import Exchange
from shardsim.simulator.network.collectives import BUS_FACTOR, Algo, GroupLayout, PhaseRun, algo_for, check_algo, plan
from shardsim.simulator.network.fluid import Network
from shardsim.simulator.network.linkgroups import group_links
from shardsim.simulator.network.links import LinkGraph, links_for
from shardsim.specs.bounds import world_refusal
from shardsim.specs.hardware.topology import Cluster

OPS = tuple(BUS_FACTOR)  # the collectives timed: all_reduce, all_gather, reduce_scatter, broadcast, send_recv, ...


@dataclass(frozen=True)
class CollectiveResult:
    op: str
    ranks: int
    size_bytes: int
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    algo: str
    protocol: str  # NCCL's protocol ("" on gloo and for SageMaker's hierarchical collectives)
    backend: str
    cluster: str

    def to_dict(self) -> dict:
        return asdict(self)


def time_collectives(
    g: LinkGraph, calls: list[tuple[str, GroupLayout, float]], algo: Algo | str, backend: str, exchange=None
) -> list[float]:
    """Run several collective calls concurrently on one network; each one's finish time (the
    all-to-alls among them sending as `exchange` says, an `alltoall.Exchange`; even when None)."""
    env = simpy.Environment()
    phases = [
        plan(g, op, layout, algo, backend, nbytes, exchange if op == "all_to_all" else None)
        for op, layout, nbytes in calls
    ]
    caps, routes = group_links(g.capacity, [ph.route for phs in phases for ph in phs])  # (linkgroups.py)
    net = Network(env, caps)
    finish = [0.0] * len(calls)
    it = iter(routes)
    for i, ((op, _, nbytes), phs) in enumerate(zip(calls, phases, strict=True)):
        steps = tuple((ph.latency_s, next(it)) for ph in phs)
        PhaseRun(net, steps, nbytes, op, lambda i=i: finish.__setitem__(i, env.now)).next()
    env.run()
    return finish


def simulate_collective(
    cluster: Cluster,
    op: str,
    size_bytes: int,
    algo: str = "auto",
    backend: str = "nccl",
    ranks: int | None = None,
    proto: str = "auto",
    imbalance: float = 1.0,
) -> CollectiveResult:
    """Time `op` over the first `ranks` ranks (default: all) as nccl-tests would report it, with
    the algorithm and protocol predictions use (`algo_for`), or the ones forced. An all-to-all
    with `imbalance` > 1 sends its busiest rank that many times the mean (`Exchange.busiest`); its
    bandwidths stay S over the time, so imbalance shows as less of them."""
    too_big = world_refusal(cluster.world)
    if too_big:
        raise ConfigError(too_big, field="nodes")
    n = cluster.world if ranks is None else ranks
    if not 2 <= n <= cluster.world:
        raise ConfigError(
            f"a collective runs over 2 to the {cluster.world:,} devices of {cluster.describe()}, not {n:,} ranks"
            + ("; add --nodes" if n > cluster.world else ""),
            field="ranks",
        )
    if refusal := cluster.instance.device.backend_refusal(backend):
        raise ConfigError(refusal, field="backend")
    check_algo(op, algo if algo != "auto" or op == "all_to_all" else "ring", backend, proto)
    exchange = None
    if imbalance != 1.0:
        if op != "all_to_all":
            raise ConfigError(f"an imbalance is all_to_all's (its busiest rank's bytes), not {op}'s", field="imbalance")
        exchange = Exchange.busiest(n, imbalance)
    g = links_for(cluster)
    layout = GroupLayout(0, n, n)
    dpn = cluster.devices_per_node
    used = algo_for(op, algo, layout, dpn, backend, g, float(size_bytes), proto, exchange=exchange)
    if algo != "auto" and (used.name, used.proto) != (algo, used.proto if proto == "auto" else proto):
        why = ""
        if algo.startswith("nvls") and not cluster.instance.fabric.nvls:
            why = " (no NVLink SHARP: fabric.nvls)"
        elif algo == "nvls" and n > cluster.devices_per_node:
            why = " (across nodes NCCL runs nvls_tree)"
        forced = algo if proto == "auto" else f"{algo}/{proto}"
        raise ConfigError(
            f"NCCL offers no {forced} for {op} over {n:,} ranks on {cluster.describe()}{why}", field="algo"
        )
    (t,) = time_collectives(g, [(op, layout, float(size_bytes))], used, backend, exchange)
    algbw = size_bytes / t / 1e9 if t > 0 else float("inf")
    return CollectiveResult(
        op=op,
        ranks=n,
        size_bytes=int(size_bytes),
        time_s=t,
        algbw_GBps=algbw,
        busbw_GBps=algbw * BUS_FACTOR[op](n),
        algo=used.name,
        protocol=used.proto,
        backend=backend,
        cluster=cluster.describe(),
    )


PER_RANK_COUNT = ("all_gather", "reduce_scatter", "all_to_all")  # nccl-tests prints these counts per rank (peer)
REDUCING = ("all_reduce", "reduce_scatter")
SMALL_BYTES = 1 << 20  # the two bands of a comparison: busbw from 1 MiB up, time below it


def nccl_tests_row(r: CollectiveResult) -> dict:
    """One size as nccl-tests prints it (float32 elements, sum), with the algorithm used."""
    count = r.size_bytes // 4 // (r.ranks if r.op in PER_RANK_COUNT else 1)
    return {
        "size_bytes": r.size_bytes,
        "count": count,
        "type": "float",
        "redop": "sum" if r.op in REDUCING else "none",
        "root": 0 if r.op == "broadcast" else -1,
        "time_s": r.time_s,
        "algbw_GBps": r.algbw_GBps,
        "busbw_GBps": r.busbw_GBps,
        "algo": r.algo,
        "protocol": r.protocol,
    }


def sweep_collective(
    cluster: Cluster,
    op: str,
    sizes: list[int] | tuple[int, ...],
    algo: str = "auto",
    backend: str = "nccl",
    ranks: int | None = None,
    progress=None,
    proto: str = "auto",
    imbalance: float = 1.0,
) -> list[CollectiveResult]:
    """`simulate_collective` at every size, in order; `progress(done, total)` after each."""
    out = []
    for i, size in enumerate(sizes, start=1):
        out.append(simulate_collective(cluster, op, size, algo, backend, ranks, proto, imbalance))
        if progress is not None:
            progress(i, len(sizes))
    return out


def _error_pct(predicted: float, measured: float) -> float | None:
    return (predicted / measured - 1.0) * 100.0 if measured > 0 and math.isfinite(predicted) else None


def compare_collective(
    cluster: Cluster, measured, algo: str = "auto", backend: str = "nccl", progress=None, proto: str = "auto"
) -> dict:
    """Predicted against measured (an `NcclTestsResult`, out-of-place columns) per size, with the
    relative errors (predicted / measured − 1, in %) and a summary over the two bands: mean
    absolute busbw error for sizes >= 1 MiB, mean absolute time error below. Rows of size 0 (a
    per-rank count of 0) are left out: nothing moves."""
    if measured.collective not in OPS:
        raise ConfigError(
            f"{measured.path}: the simulator times {', '.join(OPS)}, not {measured.collective}", field="op"
        )
    n = cluster.world
    if measured.ranks is not None and measured.ranks != n:
        nodes = f" on {measured.nodes} nodes" if measured.nodes else ""
        raise ConfigError(
            f"{measured.path}: {measured.ranks} ranks{nodes}, but {cluster.describe()} has {n:,} devices", field="nodes"
        )
    kept = [m for m in measured.rows if m.size_bytes > 0]
    results = sweep_collective(
        cluster, measured.collective, [m.size_bytes for m in kept], algo, backend, None, progress, proto
    )
    rows = []
    for m, r in zip(kept, results, strict=True):
        t_us = r.time_s * 1e6
        rows.append(
            {
                "size_bytes": m.size_bytes,
                "algo": r.algo,
                "protocol": r.protocol,
                "predicted_time_us": t_us,
                "measured_time_us": m.time_us,
                "time_error_pct": _error_pct(t_us, m.time_us),
                "predicted_busbw_GBps": r.busbw_GBps,
                "measured_busbw_GBps": m.busbw_GBps,
                "busbw_error_pct": _error_pct(r.busbw_GBps, m.busbw_GBps),
            }
        )
    big = [
        abs(r["busbw_error_pct"]) for r in rows if r["size_bytes"] >= SMALL_BYTES and r["busbw_error_pct"] is not None
    ]
    small = [
        abs(r["time_error_pct"]) for r in rows if r["size_bytes"] < SMALL_BYTES and r["time_error_pct"] is not None
    ]
    summary = {
        "sizes": len(rows),
        "mean_abs_busbw_error_pct_from_1MiB": sum(big) / len(big) if big else None,
        "max_abs_busbw_error_pct_from_1MiB": max(big) if big else None,
        "mean_abs_time_error_pct_below_1MiB": sum(small) / len(small) if small else None,
        "max_abs_time_error_pct_below_1MiB": max(small) if small else None,
    }
    return {
        "file": measured.path,
        "op": measured.collective,
        "ranks": n,
        "cluster": cluster.describe(),
        "backend": backend,
        "rows": rows,
        "summary": summary,
    }
