"""Benchmark (issue 28): the pruned search against the exhaustive one, whole process.

    python experiments/bench_prune.py seed            # `shardsim sweep` vs `shardsim sweep --exhaustive`
    python experiments/bench_prune.py llama70b --nodes 4,8

Prints a table: configurations, pruned by rule, simulated, seconds (wall, a fresh process each,
imports included), seconds per configuration, and the machine's load when it started.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = {
    "seed": [],
    "llama70b": ["--workload", "llama-3.1-70b", "--topology", "p5.48xlarge", "--precision", "bf16", "--seq-len",
                 "8192", "--checkpointing", "full", "--optimizer-impl", "fused", "--global-batch", "256",
                 "--schedules", "1f1b"],  # fmt: skip
}


def run(args: list[str]) -> tuple[float, dict]:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "shardsim.cli", "sweep", "--json", "--top", "25", *args],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return time.perf_counter() - t, json.loads(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=CASES)
    p.add_argument("--nodes", default=None, help="clusters (llama70b: e.g. 4,8,16,32,64,128)")
    ns = p.parse_args()
    args = CASES[ns.case] + (["--nodes", ns.nodes] if ns.nodes else [])
    print(f"{ns.case} {' '.join(args)}: load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| search | configurations | pruned (memory / compute bound) | simulated | s whole process | s per config |")
    print("|---|---|---|---|---|---|")
    for name, extra in (("exhaustive", ["--exhaustive"]), ("pruned", [])):
        wall, doc = run(args + extra)
        n = len(doc["rows"])
        pr = doc.get("pruned", {})
        mem = pr.get("memory", sum(1 for r in doc["rows"] if not r["fits"]))
        cut = pr.get("compute bound", 0)
        print(f"| {name} | {n} | {mem} / {cut} | {n - mem - cut} | {wall:.1f} | {wall / n:.3f} |", flush=True)


if __name__ == "__main__":
    main()
