"""Benchmark: wall time of whole sweeps. Targets, not timed tests:

- the default sweep (`shardsim sweep`: every configuration of the seed scenario) under 5 s on
  the 2-core development machine;
- a 64-node p4d.24xlarge sweep (gpt-10b, bf16, batch 1/device, every configuration) under 30 s.

    python experiments/bench_sweep.py               # both sweeps, as the CLI runs them
    python experiments/bench_sweep.py --per-config  # also: each prediction timed alone (serial)
    python experiments/bench_sweep.py --repeat 10   # the end-to-end command 10 times

Reports the wall time end to end (a fresh `shardsim sweep` process printing its table: imports
included; min, median and max over --repeat runs) and of `sweep()` in process, the CPU time,
and with --per-config where the time goes by kind.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from shardsim.config import RunConfig
from shardsim.simulator.workload.resolve import load_workload
from shardsim.sweep.search import sweep
from shardsim.sweep.space import SweepSpace, enumerate_configs
from shardsim.sweep.task import default_workers, predict_row

ROOT = Path(__file__).resolve().parent.parent


CASES = {
    "seed (default sweep)": (RunConfig(), SweepSpace(), []),
    "64 x p4d.24xlarge, gpt-10b": (
        RunConfig(workload="gpt-10b", topology="p4d.24xlarge", nodes=64, precision="bf16", batch_per_device=1),
        SweepSpace(),
        [
            "--workload",
            "gpt-10b",
            "--topology",
            "p4d.24xlarge",
            "--nodes",
            "64",
            "--precision",
            "bf16",
            "--batch-per-device",
            "1",
        ],
    ),
}


def kind_of(cfg: RunConfig) -> str:
    s = cfg.strategy
    if s.kind != "pipeline":
        return "data parallel (ddp/zero/zero2d)"
    return "pipeline x sharding" if (s.degree or 1) > 1 else "pipeline"


def cli_wall(args: list[str], workers: int | None) -> float:
    cmd = [sys.executable, "-m", "shardsim.cli", "sweep", *args]
    if workers:
        cmd += ["--workers", str(workers)]
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def per_config(base: RunConfig, space: SweepSpace) -> None:
    w = load_workload(base.workload)
    en = enumerate_configs(base, space, w)
    by_kind: dict[str, list[float]] = defaultdict(list)
    slow: list[tuple[float, str]] = []
    for c in en.candidates:
        t = time.process_time()
        predict_row(c, w, "auto")
        dt = time.process_time() - t
        by_kind[kind_of(c.cfg)].append(dt)
        slow.append((dt, c.cfg.strategy.label()))
    total = sum(sum(v) for v in by_kind.values())
    print(f"    serial CPU time {total:.1f} s over {len(en.candidates)} predictions:")
    for k, v in sorted(by_kind.items()):
        print(f"      {k:32s} {len(v):4d} configs  {sum(v):7.2f} s  ({sum(v) / total * 100:4.1f}%)  max {max(v):.2f} s")
    print("    slowest:", ", ".join(f"{name} {dt:.2f} s" for dt, name in sorted(slow, reverse=True)[:5]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=None, help="default: the machine's cores")
    p.add_argument("--per-config", action="store_true", help="time each prediction alone (slow: serial)")
    p.add_argument("--skip-cli", action="store_true", help="only the in-process sweep() timing")
    p.add_argument("--repeat", type=int, default=3, help="end-to-end runs of each command (default 3)")
    ns = p.parse_args()
    print(f"machine: {os.cpu_count()} cores ({default_workers()} usable), load {os.getloadavg()[0]:.1f}")
    for name, (base, space, args) in CASES.items():
        t, c, k = time.perf_counter(), time.process_time(), _children_cpu()
        df = sweep(base, space, workers=ns.workers).table
        wall, cpu, kids = time.perf_counter() - t, time.process_time() - c, _children_cpu() - k
        print(f"{name}: {len(df)} configurations")
        print(f"    sweep() in process: {wall:.2f} s wall, {cpu + kids:.2f} s CPU ({kids:.2f} s of it in workers)")
        if not ns.skip_cli:
            walls = sorted(cli_wall(args, ns.workers) for _ in range(max(1, ns.repeat)))
            print(
                f"    shardsim sweep (fresh process, {len(walls)} runs): min {walls[0]:.2f} s, "
                f"median {statistics.median(walls):.2f} s, max {walls[-1]:.2f} s wall"
            )
            print("      each: " + ", ".join(f"{x:.2f}" for x in walls))
        if ns.per_config:
            per_config(base, space)


def _children_cpu() -> float:
    """CPU time of finished child processes (pool workers), user + system."""
    t = os.times()
    return t.children_user + t.children_system


if __name__ == "__main__":
    main()
