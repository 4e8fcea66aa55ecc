"""Benchmark: time to simulate one all-gather as the rank count grows.

Target (not a timed test): 1,024 ranks (128 x p4d.24xlarge) in under 0.1 s.
Run: python experiments/bench_collective.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from shardsim.simulator.collective import simulate_collective
from shardsim.simulator.network.collectives import _plan_cached
from shardsim.specs.hardware.topology import make_cluster


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--topology", default="p4d.24xlarge")
    args = ap.parse_args()
    print(f"{'ranks':>6} {'algo':>12} {'median s':>10} {'min s':>9}  simulated time")
    for nodes in (1, 4, 16, 64, 128, 256, 512):
        cluster = make_cluster(args.topology, nodes)
        for algo in ("ring", "hierarchical"):
            times = []
            for _ in range(args.repeat):
                _plan_cached.cache_clear()  # time a cold plan: no cached link loads
                t = time.perf_counter()
                r = simulate_collective(cluster, "all_gather", 2**30, algo)
                times.append(time.perf_counter() - t)
            med = statistics.median(times)
            print(f"{cluster.world:6d} {algo:>12} {med:10.4f} {min(times):9.4f}  {r.time_s * 1e3:9.2f} ms")


if __name__ == "__main__":
    main()
