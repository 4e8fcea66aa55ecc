"""Benchmark: the CPU one prediction costs, in this process, serially.

    python experiments/bench_cost.py                 # the seed sweep and the 70B space on 4 nodes
    python experiments/bench_cost.py seed --repeat 5

seed: every configuration of `shardsim sweep` (vit-630m on 8 x g4dn.12xlarge, `SweepSpace()`).
llama70b-4: Llama 3.1 70B, seq 8192, global batch 256 on 4 p5.48xlarge, 1F1B, checkpointing none |
full | selective, grad_accum 1 ... 64 (bench_prune.py's layout study on 4 nodes): only the
configurations that fit in memory, the others cost no simulation.

Each is predicted as a sweep predicts it (`predict_row`); the CPU time is `time.process_time`
(user + system of this process: another process on the machine does not count, but shares its
caches), the minimum of `--repeat` rounds, the memoized kernel times and collective phases
cleared before each round (a sweep starts with them empty).
"""

from __future__ import annotations

import argparse
import os
import time

from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.model.workload import Workload
from shardsim.sweep.space import Candidate, SweepSpace, enumerate_configs
from shardsim.sweep.task import predict_row

ACCUM = (1, 2, 4, 8, 16, 32, 64)


def seed() -> list[tuple[Candidate, Workload]]:
    base = RunConfig()
    w = load_workload(base.workload, base.shape, base.source)
    return [(c, w) for c in enumerate_configs(base, SweepSpace(), w).candidates]


def llama70b_4() -> list[tuple[Candidate, Workload]]:
    """The configurations of the 70B space on 4 nodes that fit in memory."""
    from shardsim.simulator.predict import prepare

    base = RunConfig(workload="llama-3.1-70b", topology="p5.48xlarge", precision="bf16", shape={"seq_len": 8192},
                     checkpointing="full", optimizer_impl="fused", nodes=4)  # fmt: skip
    space = SweepSpace(global_batch=256, schedules=("1f1b",), checkpointing=("none", "full", "selective"))
    w = load_workload(base.workload, base.shape, base.source)
    out = []
    for ga in ACCUM:
        try:
            cands = enumerate_configs(base.replace(grad_accum=ga), space, w).candidates
        except ConfigError:
            continue
        out += [(c, w) for c in cands if prepare(c.cfg, workload=w, cluster=c.cluster).fits]
    return out


CASES = {"seed": seed, "llama70b-4": llama70b_4}


def clear_caches() -> None:
    from shardsim.simulator import gpu_kernels
    from shardsim.simulator.network.collectives import _plan_cached

    _plan_cached.cache_clear()
    if hasattr(gpu_kernels.gemm_time, "cache_clear"):
        gpu_kernels.gemm_time.cache_clear()


def cpu_seconds(configs: list[tuple[Candidate, Workload]], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        clear_caches()
        t = time.process_time()
        for c, w in configs:
            predict_row(c, w, "auto")
        best = min(best, time.process_time() - t)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", help=f"of {', '.join(CASES)} (default: all)")
    p.add_argument("--repeat", type=int, default=3, help="rounds; the minimum is reported")
    ns = p.parse_args()
    if unknown := set(ns.cases) - set(CASES):
        p.error(f"unknown case {', '.join(sorted(unknown))}: choose from {', '.join(CASES)}")
    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; CPU s: min of {ns.repeat}")
    print("| space | configurations | CPU s | CPU ms per configuration |")
    print("|---|---|---|---|")
    for name in ns.cases or CASES:
        configs = CASES[name]()
        cpu = cpu_seconds(configs, ns.repeat)
        print(f"| {name} | {len(configs)} | {cpu:.2f} | {1000 * cpu / len(configs):.1f} |", flush=True)


if __name__ == "__main__":
    main()
