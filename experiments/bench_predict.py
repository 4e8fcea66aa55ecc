"""Benchmark: time to predict one step.

Targets (not timed tests): the seed scenario (32 ranks) in under 0.5 s; gpt-100b on
128 x p4d.24xlarge (1,024 ranks) with zero2d in under 2 s; growth from 32 to 4,096 ranks.
Run: python experiments/bench_predict.py
"""

from __future__ import annotations

import statistics
import time

from shardsim.config import RunConfig, Strategy
from shardsim.simulator.network.collectives import _plan_cached
from shardsim.simulator.predict import predict


def timed(cfg: RunConfig, repeat: int = 3) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        _plan_cached.cache_clear()
        t = time.perf_counter()
        p = predict(cfg)
        times.append(time.perf_counter() - t)
    return statistics.median(times), p.step_time_s


def main() -> None:
    seed = RunConfig()
    print("seed scenario: vit-630m, 8 x g4dn.12xlarge (32 ranks)")
    pipeline = Strategy("pipeline", pp=4, microbatches=8)
    strategies = (Strategy("zero"), Strategy("zero2d", degree=4), Strategy("ddp"), pipeline)
    for s in strategies:
        wall, step = timed(seed.replace(strategy=s))
        print(f"  {s.label():28s} predicted in {wall:.3f} s (step {step:.3f} s)")
    print("gpt-100b, zero2d d=64, bf16, batch 1/device on p4d.24xlarge")
    for nodes in (4, 16, 64, 128, 256, 512):
        cfg = RunConfig(
            workload="gpt-100b",
            topology="p4d.24xlarge",
            nodes=nodes,
            strategy=Strategy("zero2d", degree=min(64, nodes * 8)),
            batch_per_device=1,
            precision="bf16",
        )
        wall, step = timed(cfg)
        print(f"  {nodes * 8:5d} ranks: predicted in {wall:.3f} s (step {step:.3f} s)")


if __name__ == "__main__":
    main()
