"""Two small measurements of torch.distributed.pipelining's own CPU work on this host (no emulated
cluster; about 30 s of CPU each, one torch thread a process). Reading:
experiments/readings/pipeline-schedules.md.

    python experiments/readings/pipeline_runtime_cpu.py runtime   # 4 gloo ranks on loopback
    python experiments/readings/pipeline_runtime_cpu.py split     # one process

`runtime`: CPU seconds a rank spends in one schedule step of 8 microbatches over 4 ranks when
its stages compute almost nothing (x * w, one weight of 256), the messages the size of
small-gpt's (microbatch 2 x 128 tokens x hidden 256, fp32: 256 KiB): what the schedule runtime,
its point-to-point ops and autograd's bookkeeping cost beyond the blocks' compute.

`split`: one stage of small-gpt's layers at its microbatch, backward as pipelining runs it: full
(`stage_backward`, a B) against split (`stage_backward_input`, then `stage_backward_weight`:
an I and its W), thread CPU time, medians of alternating rounds.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as sch

PP, M, MB, SEQ, H, STEPS, WARMUP = 4, 8, 2, 128, 256, 6, 2
CASES = {  # schedule: (class, stages a rank)
    "1f1b": (sch.Schedule1F1B, 1),
    "interleaved-1f1b": (sch.ScheduleInterleaved1F1B, 2),
    "looped-bfs": (sch.ScheduleLoopedBFS, 2),
    "interleaved-zb": (sch.ScheduleInterleavedZeroBubble, 2),
    "zbv": (sch.ScheduleZBVZeroBubble, 2),
}


class Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


def rank_stages(schedule: str, rank: int, v: int) -> list[int]:
    return [rank, 2 * PP - 1 - rank] if schedule == "zbv" else [rank + i * PP for i in range(v)]


def _rank(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, PP), rank=rank, world_size=PP)
    cpu: dict[str, float] = {}
    x, target = torch.randn(M * MB, SEQ, H), torch.randn(M * MB, SEQ, H)
    for name, (cls, v) in CASES.items():
        held = rank_stages(name, rank, v)
        stages = [PipelineStage(Scale(), s, PP * v, torch.device("cpu")) for s in held]
        schedule = cls(stages if len(stages) > 1 else stages[0], n_microbatches=M, loss_fn=torch.nn.MSELoss())
        args = [x] if 0 in held else []
        kwargs = {"target": target, "losses": []} if PP * v - 1 in held else {}
        times = []
        for _ in range(WARMUP + STEPS):
            dist.barrier()
            c0 = time.process_time()
            schedule.step(*args, **kwargs)
            times.append(time.process_time() - c0)
        cpu[name] = statistics.fmean(times[WARMUP:])
    with open(f"{out}.{rank}", "w") as f:
        json.dump(cpu, f)
    dist.destroy_process_group()


def runtime() -> None:
    folder = tempfile.mkdtemp()
    mp.spawn(_rank, args=(os.path.join(folder, "store"), os.path.join(folder, "cpu")), nprocs=PP)
    by_rank = [json.load(open(os.path.join(folder, f"cpu.{r}"))) for r in range(PP)]
    print("| schedule | CPU a step, ranks 0-3 (ms) | passes a rank | ms a pass |")
    print("|---|---|---|---|")
    for name, (_, v) in CASES.items():
        ms = [1e3 * by_rank[r][name] for r in range(PP)]
        passes = M * v * (3 if name.endswith("zb") or name == "zbv" else 2)
        print(f"| {name} | {' '.join(f'{t:.1f}' for t in ms)} | {passes} | {statistics.fmean(ms) / passes:.2f} |")


def split(layers: int = 1, batch: int = MB, rounds: int = 8) -> None:
    from torch.distributed.pipelining._backward import stage_backward, stage_backward_input, stage_backward_weight

    from shardsim.runtime.models.build import build

    torch.set_num_threads(1)
    stage = torch.nn.Sequential(*list(build("small-gpt", seed=0).blocks)[1 : 1 + layers])
    x0, grad = torch.randn(batch, SEQ, H), torch.randn(batch, SEQ, H)

    def full() -> float:
        x = x0.clone().requires_grad_(True)
        y = stage(x)
        c0 = time.thread_time()
        stage_backward([y], [grad], [x])
        return time.thread_time() - c0

    def parts() -> tuple[float, float]:
        x = x0.clone().requires_grad_(True)
        y = stage(x)
        c0 = time.thread_time()
        _, groups = stage_backward_input([y], [grad], [x], stage.parameters())
        c1 = time.thread_time()
        stage_backward_weight(stage.parameters(), groups)
        return c1 - c0, time.thread_time() - c1

    for _ in range(5):
        full(), parts()
    b, i, w = [], [], []
    for _ in range(rounds):  # alternating, so the host's drift falls on both alike
        b += [full() for _ in range(10)]
        got = [parts() for _ in range(10)]
        i += [a for a, _ in got]
        w += [c for _, c in got]
    fb, fi, fw = (statistics.median(v) for v in (b, i, w))
    print(
        f"{layers} layer(s), microbatch {batch}: B {1e3 * fb:.2f} ms; I {1e3 * fi:.2f} + W {1e3 * fw:.2f} = "
        f"{1e3 * (fi + fw):.2f} ms ({100 * ((fi + fw) / fb - 1):+.1f} %); W's share {fw / (fi + fw):.3f}"
    )


if __name__ == "__main__":
    {"runtime": runtime, "split": split}[sys.argv[1] if len(sys.argv) > 1 else "runtime"]()
