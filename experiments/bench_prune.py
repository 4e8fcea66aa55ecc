"""Benchmark: the pruned search against the exhaustive one, each a fresh `shardsim sweep`
process (imports included), its rows checked against each other.

    python experiments/bench_prune.py seed          # `shardsim sweep` (the seed), --top 25
    python experiments/bench_prune.py llama70b      # the 70B layout space below, --top 2
    python experiments/bench_prune.py llama70b --nodes 4,8 --modes pruned

llama70b: Llama 3.1 70B at sequence 8192, a global batch of 256 sequences on 4, 8, ..., 128
p5.48xlarge nodes, every layout the sweep has (ddp, zero, zero2d by degree, pipelines by pp and
microbatches, 1F1B, each with the default tensor-parallel degrees and sequence parallelism) ×
gradient accumulation 1, 2, ..., 64 (the micro-batch following) × checkpointing none, full,
selective: one sweep.

Prints a table: configurations, pruned by rule, simulated, wall seconds, CPU seconds (the sweep
and its workers, `getrusage`), CPU seconds per configuration, and whether the pruned search's
recommendation and leading rows equal the exhaustive one's (when both ran); and the machine's
load when it started (the figures are only comparable on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

CASES = {
    "seed": ["--top", "25"],
    "llama70b": [
        "--workload", "llama-3.1-70b", "--topology", "p5.48xlarge", "--nodes", "4,8,16,32,64,128",
        "--precision", "bf16", "--seq-len", "8192", "--optimizer-impl", "fused", "--global-batch", "256",
        "--grad-accum", "1,2,4,8,16,32,64", "--checkpointing", "none,full,selective", "--schedules", "1f1b",
        "--top", "2", "--yes",
    ],
}  # fmt: skip
MODES = {"exhaustive": [], "pruned": ["--prune"]}


def cpu_children() -> float:
    """CPU seconds (user + system) of this process's finished children and theirs."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(args: list[str]) -> tuple[float, float, dict]:
    """(wall s, CPU s, the --json document) of a fresh `shardsim sweep` process (no result cache)."""
    t, c = time.perf_counter(), cpu_children()
    cmd = [sys.executable, "-m", "shardsim.cli", "sweep", "--json", "--no-cache", *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - t, cpu_children() - c, json.loads(out)


def _leading(doc: dict, k: int) -> list[tuple]:
    """Each cluster's `k` leading rows as (cluster, label, step time)."""
    out, seen = [], {}
    for r in sorted(doc["rows"], key=lambda r: (r["topology"], r["nodes"], r["rank"])):
        key = (r["topology"], r["nodes"])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= k:
            step = r["step_time_s"]
            out.append((key, r["label"], None if step is None or math.isnan(step) else step))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=list(CASES))
    p.add_argument("--modes", default="exhaustive,pruned", help="which searches, in this order")
    p.add_argument("--nodes", default=None, help="the clusters' node counts (e.g. 4,8)")
    ns = p.parse_args()
    args = list(CASES[ns.case])
    if ns.nodes:
        at = args.index("--nodes") if "--nodes" in args else None
        args = args[:at] + args[at + 2 :] if at is not None else args
        args += ["--nodes", ns.nodes]
    top = int(args[args.index("--top") + 1])
    print(f"{ns.case}: shardsim sweep {' '.join(args)}")
    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start")
    print("| search | configurations | pruned: memory / compute bound / chain bound | simulated | wall s | CPU s | "
          "CPU s per configuration | same answer |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    docs: dict[str, dict] = {}
    for mode in ns.modes.split(","):
        wall, cpu, doc = run(args + MODES[mode])
        docs[mode] = doc
        n = len(doc["rows"])
        pr = doc.get("pruned") or {}
        mem = pr.get("memory", sum(1 for r in doc["rows"] if not r["fits"]))
        cut, chain = pr.get("compute bound", 0), pr.get("chain bound", 0)
        same = ""
        if mode != "exhaustive" and "exhaustive" in docs:
            ex = docs["exhaustive"]
            equal = doc["recommended"] == ex["recommended"] and _leading(doc, top) == _leading(ex, top)
            same = "yes" if equal else "NO"
        print(f"| {mode} | {n:,} | {mem:,} / {cut:,} / {chain:,} | {n - mem - cut - chain:,} | {wall:.1f} | {cpu:.1f} "
              f"| {cpu / n:.4f} | {same} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
