"""A timeline of one run's collectives, per rank: put this folder on PYTHONPATH and name an
output folder, and every rank of `shardsim run` writes rank<N>.json there.

    PYTHONPATH=experiments/network/timeline TIMELINE_OUT=/tmp/tl \\
        shardsim run --workload small-gpt --topology emu-2x2 --nodes 2 --strategy zero --tp 2 \\
        --batch-per-device 4 --precision fp32 --backend gloo --steps 4
    TIMELINE_QUEUE_S=0.01 ...   # the emulated NICs' tbf queue for this run (plan.QUEUE_LATENCY_S)

What it records (perf_counter seconds): DDP's bucket all-reduces (a comm hook: start, end,
elements), every DDP parameter's gradient as it is accumulated, the forward's start, FSDP2's
all-gathers and reduce-scatters and any Python-level all-reduce (start, end, bytes, group
size), the optimizer step, and after each step the namespace's TCP counters since the start
and its NIC's qdisc. Python's own collectives only: DTensor's functional collectives are not seen.
"""

import atexit
import json
import os
import subprocess
import time

LOG: list = []


def _save() -> None:
    with open(f"{os.environ['TIMELINE_OUT']}/rank{os.environ['RANK']}.json", "w") as f:
        json.dump(LOG, f)


def _net() -> dict:
    out: dict = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):  # this network namespace's
        lines = open(path).read().splitlines()
        for head, vals in zip(lines[0::2], lines[1::2], strict=True):
            for k, x in zip(head.split()[1:], vals.split()[1:], strict=True):
                out[head.split()[0] + k] = int(x)
    tc = subprocess.run(["tc", "-s", "qdisc", "show", "dev", "nic0"], capture_output=True, text=True)
    out["tc"] = tc.stdout
    return out


def _install() -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    start = _net()

    def snapshot(*_) -> None:
        now = _net()
        LOG.append(("net", {k: v - start.get(k, 0) for k, v in now.items() if k != "tc" and v != start.get(k, 0)}))
        LOG.append(("qdisc", now["tc"]))
        _save()

    init = DDP.__init__

    def ddp_init(self, *a, **k) -> None:
        init(self, *a, **k)
        pg, ws = self.process_group, dist.get_world_size(self.process_group)

        def hook(_state, bucket):
            t0, n = time.perf_counter(), bucket.buffer().numel()
            fut = dist.all_reduce(bucket.buffer().div_(ws), group=pg, async_op=True).get_future()

            def done(f):
                LOG.append(("bucket", t0, time.perf_counter(), n))
                return f.value()[0]

            return fut.then(done)

        self.register_comm_hook(None, hook)
        self.register_forward_pre_hook(lambda *_: LOG.append(("fwd", time.perf_counter())))
        for name, p in self.module.named_parameters():
            p.register_post_accumulate_grad_hook(lambda _p, name=name: LOG.append(("grad", time.perf_counter(), name)))

    DDP.__init__ = ddp_init

    def timed(name: str) -> None:
        orig = getattr(dist, name)

        def call(*a, **k):
            t0 = time.perf_counter()
            group = k.get("group")
            size = dist.get_world_size(group) if group is not None else dist.get_world_size()
            tensors = [x for x in (*a[:2], *k.values()) if hasattr(x, "numel")]
            nbytes = max((x.numel() * x.element_size() for x in tensors), default=0)
            work = orig(*a, **k)
            if work is not None and k.get("async_op"):
                work.get_future().then(lambda _f: LOG.append((name, t0, time.perf_counter(), nbytes, size)))
            else:
                LOG.append((name, t0, time.perf_counter(), nbytes, size))
            return work

        setattr(dist, name, call)

    for name in ("all_gather_single", "reduce_scatter_single", "all_reduce"):
        timed(name)
    register_optimizer_step_pre_hook(lambda *_: LOG.append(("opt0", time.perf_counter())))
    register_optimizer_step_post_hook(lambda *_: (LOG.append(("opt1", time.perf_counter())), snapshot()))
    atexit.register(_save)


if os.environ.get("TIMELINE_QUEUE_S"):  # in shardsim run's own process, before it plans the cluster
    import shardsim.runtime.emulation.plan as _plan

    _plan.QUEUE_LATENCY_S = float(os.environ["TIMELINE_QUEUE_S"])
if os.environ.get("TIMELINE_OUT") and os.environ.get("RANK") is not None:
    _install()
