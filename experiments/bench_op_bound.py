"""Benchmark: the spaces of dense training today against the simulator's op bound.

For each space (llama-3.1-70b on 16 x p5.48xlarge at 8,192 tokens; llama-3.1-405b on
64 x p5.48xlarge at 8,192 tokens and, with cp, at 131,072 tokens; pp up to 16, up to 64
microbatches, every pipeline schedule with up to 4 stages per rank): how many configurations a
sweep keeps (how many of them fit, to be simulated; the others are rows of their memory) and
drops (by kind of reason), the largest op estimate of the space with the bound lifted and of
those that fit, and the wall time, CPU time (which a loaded machine does not stretch) and peak
RSS of predicting the `--worst` largest that fit, in a fresh process each.
Run: nice -n 19 python experiments/bench_op_bound.py [--worst 2] [--spaces 70b,405b-8k,405b-131k]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from shardsim.config import load_config
from shardsim.simulator import scale
from shardsim.simulator.scale import MAX_PLAN_OPS, plan_ops_estimate
from shardsim.simulator.workload.resolve import load_workload
from shardsim.sweep.space import SweepSpace, enumerate_configs, unfit

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv")
SPACES = {  # name: (workload, nodes, seq_len, extra axes)
    "70b": ("llama-3.1-70b", 16, 8192, {}),
    "405b-8k": ("llama-3.1-405b", 64, 8192, {"float8": ("none", "tensorwise")}),
    "405b-131k": ("llama-3.1-405b", 64, 131072, {"float8": ("none", "tensorwise"), "cp": (1, 2, 4, 8, 16)}),
}

# one fresh interpreter per prediction: its peak RSS is the prediction's; the bound lifted, so that
# the configurations beyond it are measured too
_MEASURE = """
import json, resource, sys, time
from shardsim.config import RunConfig
from shardsim.simulator import scale
scale.MAX_PLAN_OPS = 10**12
from shardsim.simulator.predict import predict
cfg = RunConfig.from_dict(json.loads(sys.argv[1]))
t, c = time.perf_counter(), time.process_time()
p = predict(cfg)
print(json.dumps({"s": round(time.perf_counter() - t, 2), "cpu_s": round(time.process_time() - c, 2),
                  "rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
"""


def space(name: str):
    workload, nodes, seq_len, extra = SPACES[name]
    base = load_config(
        None, {"workload": workload, "topology": "p5.48xlarge", "nodes": nodes, "precision": "bf16", "seq_len": seq_len}
    )
    axes = {"pp": (2, 4, 8, 16), "microbatches": (1, 2, 4, 8, 16, 32, 64), "stages_per_rank": (1, 2, 4)}
    return base, SweepSpace(schedules=SCHEDULES, **axes, **extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worst", type=int, default=2, help="predictions to time per space, the largest first")
    ap.add_argument("--spaces", default=",".join(SPACES))
    args = ap.parse_args()
    print(f"MAX_PLAN_OPS {MAX_PLAN_OPS:,}")
    for name in args.spaces.split(","):
        base, sp = space(name)
        w = load_workload(base.workload, base.shape, base.source)
        n = len(w.layers)
        kept = enumerate_configs(base, sp, w)
        bound = scale.MAX_PLAN_OPS
        scale.MAX_PLAN_OPS = 10**12
        try:
            every = enumerate_configs(base, sp, w)
        finally:
            scale.MAX_PLAN_OPS = bound
        largest = max(plan_ops_estimate(c.cfg, n) for c in every.candidates)
        fit = [c for c in kept.candidates if not unfit(c.cfg, c.cluster, w)]
        est = sorted(((plan_ops_estimate(c.cfg, n), c.index, c) for c in fit), key=lambda x: -x[0])
        print(
            f"{name}: {len(kept.candidates):,} predicted ({len(fit):,} fit), dropped {dict(kept.dropped_kinds)}; "
            f"largest estimate {largest:,} ops, of those that fit {est[0][0] if est else 0:,}"
        )
        for ops, _, c in est[: args.worst]:
            out = subprocess.run(
                [sys.executable, "-c", _MEASURE, json.dumps(c.cfg.to_dict())], capture_output=True, text=True
            )
            got = json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr.strip()[-200:]}
            print(f"  {ops:>9,} ops  {got}  {c.label}")


if __name__ == "__main__":
    main()
