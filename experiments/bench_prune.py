"""Benchmark (issue 28): the pruned search against the exhaustive one, whole process.

    python experiments/bench_prune.py seed            # `shardsim sweep --prune` vs `shardsim sweep`
    python experiments/bench_prune.py llama70b --nodes 4,8
    python experiments/bench_prune.py llama70b-study  # the layout study's space (below), 4-128 p5 nodes

llama70b-study: Llama 3.1 70B, seq 8192, global batch 256 on 4, 8, ..., 128 p5.48xlarge: every
TP (default degrees) × PP × DP (ddp, zero, zero2d by degree) × micro-batch (grad_accum 1 ... 64,
the micro-batch following) × checkpointing (none, full, selective) layout, 1F1B, as one process
that runs one `sweep()` per grad_accum (`--inner`).

Prints a table: configurations, pruned by rule, simulated, seconds (wall, a fresh process each,
imports included), seconds per configuration, and the machine's load when it started.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

CASES = {
    "seed": [],
    "llama70b": [
        "--workload",
        "llama-3.1-70b",
        "--topology",
        "p5.48xlarge",
        "--precision",
        "bf16",
        "--seq-len",
        "8192",
        "--checkpointing",
        "full",
        "--optimizer-impl",
        "fused",
        "--global-batch",
        "256",
        "--schedules",
        "1f1b",
    ],  # fmt: skip
}


def cpu_children() -> float:
    """CPU seconds (user + system) of this process's finished children and theirs."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(args: list[str]) -> tuple[float, float, dict]:
    """(wall s, CPU s, the --json document) of a fresh `shardsim sweep` process."""
    t, c = time.perf_counter(), cpu_children()
    out = subprocess.run([sys.executable, "-m", "shardsim.cli", "sweep", "--json", "--top", "25", *args],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return time.perf_counter() - t, cpu_children() - c, json.loads(out)


ACCUM = (1, 2, 4, 8, 16, 32, 64)


def study(nodes: str, prune: bool) -> None:
    """The layout study's space, swept in this process; prints one JSON line of totals."""
    from shardsim.config import RunConfig
    from shardsim.core.errors import ConfigError
    from shardsim.simulator.sweep.search import sweep
    from shardsim.simulator.sweep.space import SweepSpace

    base = RunConfig(workload="llama-3.1-70b", topology="p5.48xlarge", precision="bf16", shape={"seq_len": 8192},
                     checkpointing="full", optimizer_impl="fused")  # fmt: skip
    space = SweepSpace(nodes=tuple(map(int, nodes.split(","))), global_batch=256, schedules=("1f1b",),
                       checkpointing=("none", "full", "selective"))  # fmt: skip
    n, unfit, cut, chain, best = 0, 0, 0, 0, None
    for ga in ACCUM:
        try:
            r = sweep(base.replace(grad_accum=ga), space, workers=2, prune=prune, keep=2)
        except ConfigError:
            continue
        n += len(r.table)
        unfit += int((~r.table["fits"]).sum())
        cut += r.pruned.get("compute bound", 0)
        chain += r.pruned.get("chain bound", 0)
        b = r.recommendation.best
        if b is not None and (best is None or b["samples_per_s"] > best[1]):
            best = (f"{b['label']} ga {ga} on {b['nodes']} nodes", b["samples_per_s"])
    print(json.dumps({"n": n, "memory": unfit, "compute bound": cut, "chain bound": chain, "best": best}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=[*CASES, "llama70b-study"])
    p.add_argument("--inner", choices=["pruned", "exhaustive"], help=argparse.SUPPRESS)
    p.add_argument("--modes", default="pruned,exhaustive", help="llama70b-study: which searches (in this order)")
    p.add_argument("--nodes", default=None, help="clusters (llama70b: e.g. 4,8,16,32,64,128)")
    ns = p.parse_args()
    if ns.case == "llama70b-study":
        nodes = ns.nodes or "4,8,16,32,64,128"
        if ns.inner:
            return study(nodes, ns.inner == "pruned")
        print(f"{ns.case} nodes {nodes}: load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        for mode in ns.modes.split(","):
            t, c = time.perf_counter(), cpu_children()
            cmd = [sys.executable, __file__, ns.case, "--nodes", nodes, "--inner", mode]
            doc = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            wall, cpu = time.perf_counter() - t, cpu_children() - c
            sim = doc["n"] - doc["memory"] - doc["compute bound"] - doc["chain bound"]
            print(f"| {mode} | {doc['n']} | {doc['memory']} / {doc['compute bound']} / {doc['chain bound']} | {sim} | "
                  f"{wall:.1f} | {cpu:.1f} | {cpu / doc['n']:.3f} | best {doc['best']}", flush=True)  # fmt: skip
        return None
    args = CASES[ns.case] + (["--nodes", ns.nodes] if ns.nodes else [])
    print(f"{ns.case} {' '.join(args)}: load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| search | configurations | pruned: memory / compute bound / chain bound | simulated | s wall | s CPU | "
          "CPU s per config |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, extra in (("exhaustive", []), ("pruned", ["--prune"])):
        wall, cpu, doc = run(args + extra)
        n = len(doc["rows"])
        pr = doc.get("pruned", {})
        mem = pr.get("memory", sum(1 for r in doc["rows"] if not r["fits"]))
        cut, chain = pr.get("compute bound", 0), pr.get("chain bound", 0)
        sim = n - mem - cut - chain
        row = f"| {name} | {n} | {mem} / {cut} / {chain} | {sim} | {wall:.1f} | {cpu:.1f} | {cpu / n:.3f} |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
