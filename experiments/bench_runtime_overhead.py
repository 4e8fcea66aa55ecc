"""Benchmark: the runtime's overhead over a minimal hand-written FSDP2 script.

Target: `shardsim run` step time / hand-written step time <= 1.03 on the same configuration.

Both sides run the same model (runtime.models.builders.build_model of a preset), FSDP2 `fully_shard`
per block then the root, activation checkpointing per block, Adam, one torch thread per rank,
launched by torchrun on this machine, and time each step between two barriers. The
hand-written side is this file run under torchrun with ``--worker`` (`handwritten_worker`):
it does not import the runtime's training code. Runs alternate (A B A B ...) so that a
change in the machine's load hits both; the ratio compares the medians of all measured steps.
Also reported: the median of per-round ratios, the ratio of the fastest steps, the ratio of
rank 0's CPU time per step, and an interleaved run (`interleaved_worker`: the runtime's
training step and the hand-written one alternating step by step in the same torchrun job),
which other processes on a shared machine disturb far less than separate runs.

Run: python experiments/bench_runtime_overhead.py [--workload small-gpt] [--nproc 2]
     [--strategy zero] [--rounds 3] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shardsim.core.files import atomic_write

ROOT = Path(__file__).resolve().parent.parent


def _handwritten_model(ns: argparse.Namespace):
    """What a user would write by hand: FSDP2 over a 1-D or (replicate, shard) mesh."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from shardsim.runtime.models.builders import build_model
    from shardsim.specs.model.library import PRESETS

    world = dist.get_world_size()
    if ns.degree and ns.degree < world:
        mesh = init_device_mesh("cpu", (world // ns.degree, ns.degree), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    torch.manual_seed(0)
    model = build_model(PRESETS[ns.workload])
    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def batch(step: int):
        g = torch.Generator().manual_seed(step * 1000 + dist.get_rank())
        return model.sample_batch(ns.batch, g)

    def step(x, y) -> None:
        loss = model.loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return batch, step


def _timed(fn) -> tuple[float, float]:
    import torch.distributed as dist

    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    c1 = time.process_time()
    dist.barrier()
    return time.perf_counter() - t0, c1 - c0


def handwritten_worker(ns: argparse.Namespace) -> None:
    """The hand-written script: ~40 lines of FSDP2, no runtime code (run under torchrun)."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    batch, step = _handwritten_model(ns)
    times, cpu_times = [], []
    for i in range(ns.warmup + ns.steps):
        x, y = batch(i)
        wall, cpu = _timed(lambda: step(x, y))  # noqa: B023
        times.append(wall)
        cpu_times.append(cpu)
    if dist.get_rank() == 0:
        w = ns.warmup
        print("RESULT " + json.dumps({"step_times_s": times[w:], "step_cpu_times_s": cpu_times[w:]}), flush=True)
    dist.destroy_process_group()


def interleaved_worker(ns: argparse.Namespace) -> None:
    """Both in one torchrun job: the runtime's own training step (runtime.trainer.setup, as
    `shardsim run` builds it) and the hand-written one, alternating step by step, so that
    the load of other processes hits both alike; isolates the runtime's per-step code."""
    import datetime

    import torch
    import torch.distributed as dist

    from shardsim.config import load_config
    from shardsim.runtime.trainer import setup

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("gloo", timeout=timeout)
    batch, step = _handwritten_model(ns)
    strategy = {"strategy": "zero2d", "degree": ns.degree} if ns.degree else {"strategy": "zero"}
    values = {"workload": ns.workload, "topology": "emu-2x2", "batch_per_device": ns.batch, "checkpointing": True}
    cfg = load_config(None, {**values, **strategy})
    job = setup(cfg, dist.get_rank(), dist.get_world_size(), torch.device("cpu"), timeout)

    def runtime_step(batches) -> None:
        job.forward_backward(batches)
        job.optimizer_step()

    out: dict[str, list[float]] = {"shardsim": [], "hand": []}
    for i in range(ns.warmup + ns.steps):
        x, y = batch(i)
        batches = job.make_batches(i)
        order = [("hand", lambda: step(x, y)), ("shardsim", lambda: runtime_step(batches))]  # noqa: B023
        for name, fn in order[:: 1 if i % 2 else -1]:
            wall, _ = _timed(fn)
            if i >= ns.warmup:
                out[name].append(wall)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def run_handwritten(ns: argparse.Namespace, worker: str = "hand") -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ns.nproc}",
           __file__, "--worker", worker, "--workload", ns.workload, "--steps", str(ns.steps),
           "--warmup", str(ns.warmup), "--batch", str(ns.batch), "--degree", str(ns.degree or 0)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{worker} run failed:\n{proc.stderr[-3000:]}")


def run_shardsim(ns: argparse.Namespace, out: str) -> dict:
    strategy = ["--strategy", "zero2d", "--degree", str(ns.degree)] if ns.degree else ["--strategy", "zero"]
    cmd = [sys.executable, "-m", "shardsim.cli", "run", "--topology", "emu-2x2", "--workload", ns.workload,
           "--nproc", str(ns.nproc), *strategy, "--batch-per-device", str(ns.batch), "--checkpointing",
           "--steps", str(ns.steps), "--warmup", str(ns.warmup), "--out", out, "--json"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"shardsim run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="small-gpt")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--degree", type=int, default=0, help="zero2d shard degree (0: zero over all ranks)")
    ap.add_argument("--batch", type=int, default=4, help="samples per rank")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", choices=("hand", "interleaved"), help=argparse.SUPPRESS)
    ap.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    ns = ap.parse_args()
    if ns.worker:
        (handwritten_worker if ns.worker == "hand" else interleaved_worker)(ns)
        return
    inter = run_handwritten(ns, "interleaved")
    same = statistics.median(inter["shardsim"]) / statistics.median(inter["hand"])
    pairs = statistics.median(a / b for a, b in zip(inter["shardsim"], inter["hand"], strict=True))
    print(f"same processes, alternating steps: ratio {same:.3f} (median of step pairs {pairs:.3f})", flush=True)
    wall: dict[str, list[float]] = {"shardsim": [], "hand": []}
    cpu: dict[str, list[float]] = {"shardsim": [], "hand": []}
    rounds: list[float] = []
    with tempfile.TemporaryDirectory() as out:
        for r in range(ns.rounds):
            pair = [("shardsim", lambda: run_shardsim(ns, out)), ("hand", lambda: run_handwritten(ns))]
            if r % 2:
                pair.reverse()
            med = {}
            for name, fn in pair:
                rec = fn()
                wall[name] += rec["step_times_s"]
                cpu[name] += rec["step_cpu_times_s"]
                med[name] = statistics.median(rec["step_times_s"])
                print(
                    f"round {r + 1} {name:9s} median {med[name] * 1e3:8.2f} ms wall, "
                    f"{statistics.median(rec['step_cpu_times_s']) * 1e3:8.2f} ms CPU (rank 0)",
                    flush=True,
                )
            rounds.append(med["shardsim"] / med["hand"])
    ratio = statistics.median(wall["shardsim"]) / statistics.median(wall["hand"])
    result = {
        "workload": ns.workload,
        "nproc": ns.nproc,
        "strategy": f"zero2d d={ns.degree}" if ns.degree else "zero",
        "steps_each": len(wall["shardsim"]),
        "shardsim_median_s": statistics.median(wall["shardsim"]),
        "handwritten_median_s": statistics.median(wall["hand"]),
        "ratio": ratio,
        "ratio_per_round": rounds,
        "ratio_median_of_rounds": statistics.median(rounds),
        "ratio_of_fastest_steps": min(wall["shardsim"]) / min(wall["hand"]),
        "cpu_ratio": statistics.median(cpu["shardsim"]) / statistics.median(cpu["hand"]),
        "interleaved_ratio": same,
        "interleaved_pair_ratio": pairs,
        "target": 1.03,
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result))
    print(
        f"overhead ratio {ratio:.3f} wall (median of rounds {result['ratio_median_of_rounds']:.3f}, "
        f"fastest steps {result['ratio_of_fastest_steps']:.3f}), {result['cpu_ratio']:.3f} CPU, "
        f"{same:.3f} interleaved in the same processes; "
        f"target <= 1.03: {'OK' if ratio <= 1.03 else 'ABOVE TARGET'}"
    )
    if ns.json:
        atomic_write(Path(ns.json), json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
