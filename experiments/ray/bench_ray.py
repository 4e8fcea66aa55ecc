"""Benchmark: a sweep's predictions on Ray at 1 and 2 workers, against the local
executor; the per-task cost, Ray's overhead per task and the driver's serial part, for the
expected scaling to N workers. A benchmark, not a timed test.

    python experiments/ray/bench_ray.py [--nodes 4,8,16,32,64,128] [--workers 1,2] [--out FILE.json]

The space: Llama 3.1 70B at sequence 8192 on p5.48xlarge, every layout the sweep enumerates
(tensor, pipeline (1F1B), data parallelism, bf16, full checkpointing, fused Adam, batch 1 per
GPU) at each node count. Measured, in this order, on this machine as it is (its load average is
recorded: other processes share its cores):

- serial: every prediction in this process, each timed (the per-task cost c);
- no-op: one Ray task per configuration with the same arguments, returning a row of the same
  size without predicting, at 1 worker (Ray's cost per task, driver and worker together: o);
- ray N: `predict_all` on a local Ray instance of N workers: start, predictions, stop; rows
  compared with the serial ones (identical); the CPU time of the driver and of Ray's processes.

Wall times on a shared, loaded machine say more about the load than about Ray; the CPU times
(per task: serial, driver, Ray's processes) are what the scaling model uses.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from shardsim.config import RunConfig
from shardsim.simulator.workload.resolve import load_workload
from shardsim.sweep.execute import predict_all
from shardsim.sweep.ray_executor import RayExecutor
from shardsim.sweep.space import SweepSpace, enumerate_configs
from shardsim.sweep.task import predict_row

HERE = Path(__file__).parent


TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of `pid`'s descendants now (Linux /proc): Ray's processes."""
    total = 0.0
    try:
        kids = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return 0.0
    for kid in kids:
        try:
            f = Path(f"/proc/{kid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / TICK
        except OSError:
            continue
        total += _tree_cpu(kid)
    return total


def _same(a: list[dict], b: list[dict]) -> bool:
    """Rows equal, NaN equal to NaN."""
    return json.dumps(a, allow_nan=True) == json.dumps(b, allow_nan=True)


def noop_seconds(cands, w, rows, workers: int) -> float:
    """Wall time of one no-op task per configuration (same arguments, a row back) on `workers`."""
    import ray

    def echo(c, w, algo, row):
        return row, ""

    with RayExecutor(workers=workers) as ex:
        ex._start()
        task = ray.remote(num_cpus=1)(echo)
        wref = ray.put(w)
        t0 = time.perf_counter()
        refs = [task.remote(c, wref, "auto", r) for c, r in zip(cands, rows, strict=True)]
        pending = refs
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.1)
            ray.get(ready)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="4,8,16,32,64,128")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--out", default=str(HERE / "bench.json"))
    a = ap.parse_args()
    base = RunConfig(workload="llama-3.1-70b", topology="p5.48xlarge", nodes=4, precision="bf16",
                     shape={"seq_len": 8192}, checkpointing="full", optimizer_impl="fused",
                     batch_per_device=1)  # fmt: skip
    space = SweepSpace(nodes=tuple(int(n) for n in a.nodes.split(",")), schedules=("1f1b",))
    w = load_workload(base.workload, base.shape, base.source)
    cands = enumerate_configs(base, space, w).candidates
    n = len(cands)
    out: dict = {"configurations": n, "load_average_start": os.getloadavg()[0], "cores": os.cpu_count()}
    print(f"{n} configurations; load average {os.getloadavg()[0]:.1f}", flush=True)

    times, rows = [], []
    t0, cpu0 = time.perf_counter(), time.process_time()
    for c in cands:
        t = time.perf_counter()
        rows.append(predict_row(c, w, "auto"))
        times.append(time.perf_counter() - t)
    serial, serial_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    simulated = [t for t, r in zip(times, rows, strict=True) if r["step_time_s"] == r["step_time_s"]]
    out["serial"] = {
        "seconds": serial,
        "cpu_s": serial_cpu,
        "per_task_cpu_s": serial_cpu / n,
        "per_task_mean_s": serial / n,
        "per_task_median_s": statistics.median(times),
        "simulated": len(simulated),
        "per_simulated_mean_s": sum(simulated) / max(1, len(simulated)),
    }
    print(f"serial: {serial:.1f} s, {serial / n * 1e3:.1f} ms a configuration", flush=True)

    noop = noop_seconds(cands, w, rows, 1)
    out["noop_1_worker"] = {"seconds": noop, "per_task_s": noop / n}
    print(f"no-op tasks, 1 worker: {noop:.2f} s, {noop / n * 1e3:.2f} ms a task", flush=True)

    for k in (int(x) for x in a.workers.split(",")):
        t0 = time.perf_counter()
        with RayExecutor(workers=k) as ex:
            ex._start()
            t1, d1, r1 = time.perf_counter(), time.process_time(), _tree_cpu(os.getpid())
            got = predict_all(cands, w, executor=ex)
            t2, d2, r2 = time.perf_counter(), time.process_time(), _tree_cpu(os.getpid())
        t3 = time.perf_counter()
        out[f"ray_{k}"] = {
            "start_s": t1 - t0,
            "predict_s": t2 - t1,
            "stop_s": t3 - t2,
            "driver_cpu_s": d2 - d1,  # this process (the driver and Ray's threads in it)
            "ray_processes_cpu_s": r2 - r1,  # the workers (predictions and Ray's part), raylet, GCS
            "total_s": t3 - t0,
            "identical_to_serial": _same(got, rows),
            "load_average": os.getloadavg()[0],
        }
        print(f"ray {k} workers: {out[f'ray_{k}']}", flush=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
