"""`shardsim collective`: one collective on a cluster, nccl-tests style (time, algbw, busbw)."""

from __future__ import annotations

import argparse
import json
import math

from shardsim.config.flags import add_algo_argument, setting_type
from shardsim.config.schema import BACKENDS
from shardsim.core.flagtypes import Count, Size
from shardsim.core.units import COMPACT_UP_TO
from shardsim.simulator.scale import MAX_MESSAGE_BYTES, MAX_WORLD

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv")


def _cmd_collective(ns: argparse.Namespace) -> int:
    from shardsim.core.units import format_bytes, format_seconds
    from shardsim.simulator.collective import simulate_collective
    from shardsim.simulator.hardware.topology import make_cluster

    cluster = make_cluster(ns.topology, ns.nodes)
    r = simulate_collective(cluster, ns.op, ns.size, ns.algo, ns.backend, ns.ranks)
    if ns.json:  # a bandwidth that is no number (one rank moves nothing, in no time) is null: JSON has no Infinity
        fields = ("op", "ranks", "size_bytes", "time_s", "algbw_GBps", "busbw_GBps", "algo", "backend")
        doc = {k: _finite_or_none(getattr(r, k)) for k in fields}
        print(json.dumps(doc, allow_nan=False))
        return 0
    print(f"{r.op} of {format_bytes(r.size_bytes)} over {r.ranks} ranks on {r.cluster} ({r.algo}, {r.backend})")
    print(f"  time   {format_seconds(r.time_s)}")
    print(f"  algbw  {_bandwidth(r.algbw_GBps)}")
    print(f"  busbw  {_bandwidth(r.busbw_GBps)}")
    return 0


def _finite_or_none(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _bandwidth(gbps: float) -> str:
    """``230.79 GB/s``; ``- (no time)`` where nothing was timed; a huge one in scientific notation."""
    if not math.isfinite(gbps):
        return "- (no time)"
    return f"{gbps:.3e} GB/s" if abs(gbps) >= COMPACT_UP_TO else f"{gbps:.2f} GB/s"


def register(sub) -> None:
    c = sub.add_parser(
        "collective",
        help="time one collective on a cluster (nccl-tests style)",
        description="Time one collective on a described cluster with the simulator's network: "
        "time, algorithm bandwidth and bus bandwidth as nccl-tests reports them.",
    )
    c.add_argument("--topology", default="p4d.24xlarge", help="instance type or YAML path (default: p4d.24xlarge)")
    c.add_argument(
        "--nodes", type=setting_type("nodes"), default=None, help="number of nodes (default 1, or the emulated count)"
    )
    c.add_argument("--op", default="all_reduce", choices=OPS, help="the collective (default: all_reduce)")
    c.add_argument(
        "--size",
        type=Size(MAX_MESSAGE_BYTES),
        default="1GiB",
        help="message size S as nccl-tests counts it, e.g. 1GiB, 25MB (default: 1GiB)",
    )
    add_algo_argument(c, auto=True)
    c.add_argument("--backend", default="nccl", choices=BACKENDS, help="communication library (default: nccl)")
    c.add_argument(
        "--ranks",
        type=Count(MAX_WORLD, minimum=2),
        default=None,
        help="use only the first N ranks of the cluster, at least 2 (default: all)",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=_cmd_collective)
