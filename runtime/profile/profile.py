"""`shardsim profile`: measure a workload's blocks on the local device.

Times each block's forward and backward (and the Adam step per parameter; on CPU, FSDP2's
own work and its Adam's overhead) with real tensors at the configured batch, one torch
thread per rank on CPU as the runtime uses, and writes a profile that `predict`, `sweep`
and `validate` take with `--profile`. The simulator scales the per-sample times linearly
with the microbatch, so profile at the microbatch size you will predict.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from shardsim.runtime.hostspeed import QUIET_STEAL_SHARE, Probe, SpeedLog, StealClock
from shardsim.simulator.config import add_config_arguments, config_from_args
from shardsim.simulator.errors import ConfigError

WHOLE_ROUNDS = 3
# the world size FSDP2's own work is timed at when no rank count is given; it changes little
# with it (small-gpt, microbatch 4: 33-45 ms forward and 41-53 ms backward at 1 to 8 ranks)
FSDP_WORLD = 8
SHARING_ROUNDS_MAX = 6  # core-sharing rounds timed at most per rank count (3 quiet ones wanted)


def _unit() -> float:
    return 1.0


def _median_time(fn, repeats: int, warmup: int, sync, speed: Callable[[], float] = _unit) -> float:
    """Median seconds of `fn()`, each timing divided by `speed()` read just before it (a
    SpeedLog: the host's speed then, in probe seconds; 1 by default)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        s = speed()
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) / s)
    return statistics.median(times)


def _fwd_bwd_times(forward, repeats: int, warmup: int, sync, speed: Callable[[], float] = _unit) -> tuple[float, float]:
    """Median forward and median backward seconds, each timed on its own in the same iteration
    (`forward()` returns the scalar to differentiate): no difference of two noisy medians.
    Each iteration is divided by `speed()` read just before it (see _median_time)."""
    for _ in range(warmup):
        forward().backward()
    fwd, bwd = [], []
    for _ in range(repeats):
        s = speed()
        sync()
        t0 = time.perf_counter()
        loss = forward()
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        fwd.append((t1 - t0) / s)
        bwd.append((time.perf_counter() - t1) / s)
    return statistics.median(fwd), statistics.median(bwd)


def profile_workload(
    workload: str,
    batch: int | Sequence[int],
    *,
    device: str = "cpu",
    threads: int = 1,
    repeats: int = 9,
    warmup: int = 2,
    precision: str = "fp32",
    fsdp_world: int = FSDP_WORLD,
) -> dict:
    """Forward/backward seconds of every block at each microbatch size in `batch` (per
    microbatch, and per sample at the first size), and Adam seconds per parameter.

    Blocks timed one by one pay per-call costs (autograd start-up, a backward seed) that a
    training step pays once: the block times are scaled so that, per size, their forward
    and backward sums equal the whole model's forward (with the loss) and backward, timed
    as training runs them (a named correction; both raw figures are kept in the file)."""
    import torch

    batches = sorted({batch} if isinstance(batch, int) else set(batch))
    ctx = _setup(workload, device, threads, precision)
    # every timed pass divided by the host-speed probe read just before it (probe units)
    speed = SpeedLog(Probe() if ctx.device.type == "cpu" else None)
    blocks_of = {b: _block_times(ctx, b, repeats, warmup, speed) for b in batches}
    # The whole model, which sets every size's level, is timed in WHOLE_ROUNDS rounds that go
    # through every size in turn (median of the rounds' medians): on this shared host a few
    # seconds at one speed no longer set one size's figure alone (timed back to back, size by
    # size, one profile's microbatch 4 took 2.6 times its microbatch 2, and the next 1.8 times).
    per_round = max(1, math.ceil(repeats / WHOLE_ROUNDS))
    rounds: dict[int, list[tuple[float, float]]] = {b: [] for b in batches}
    for r in range(WHOLE_ROUNDS):
        for b in batches:
            rounds[b].append(_whole_times(ctx, b, per_round, warmup if r == 0 else 1, speed))
    model = ctx.model
    opt = torch.optim.Adam(model.parameters())
    _gradients(model, ctx.autocast)
    n_params = sum(p.numel() for p in model.parameters())
    t_opt = _median_time(opt.step, repeats, warmup, ctx.sync, speed)
    del opt  # its states: the sharded optimizer below needs the memory (vit-630m: 5 GB)
    for p in model.parameters():
        p.grad = None
    sharded = fsdp = None
    if ctx.device.type == "cpu":
        fsdp = fsdp_overhead(ctx, batches[-1], fsdp_world, repeats, warmup, speed)
        t_sharded = sharded_optimizer_step(model, repeats, warmup, speed)
        sharded = None if t_sharded is None else max(0.0, t_sharded - t_opt)
    ref = speed.ref  # every figure at one speed: the probes' mean (1 probe unit = `ref` seconds)
    by_batch, whole = {}, {}
    for b in batches:
        blocks = blocks_of[b]
        fwd = ref * statistics.median(f for f, _ in rounds[b])
        bwd = ref * statistics.median(w for _, w in rounds[b])
        sf, sb = sum(v[0] for v in blocks.values()), sum(v[1] for v in blocks.values())
        whole[str(b)] = {"fwd_s": fwd, "bwd_s": bwd, "blocks_fwd_s": ref * sf, "blocks_bwd_s": ref * sb}
        by_batch[str(b)] = {k: [f * fwd / sf, w * bwd / sb] for k, (f, w) in blocks.items()}
    t_opt *= ref
    sharded = None if sharded is None else sharded * ref
    if fsdp is not None:
        fsdp = {"world": fsdp_world, "batch": batches[-1], "fwd_s": fsdp[0] * ref, "bwd_s": fsdp[1] * ref}
    first = batches[0]
    dev = ctx.device
    return {
        "workload": workload,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "threads": threads if dev.type == "cpu" else None,
        "batch": first,
        "precision": precision,
        "torch": torch.__version__,
        "blocks_by_batch_s": by_batch,
        "whole_model_s": whole,
        "blocks_per_sample_s": {k: [f / first, b / first] for k, (f, b) in by_batch[str(first)].items()},
        "optimizer_per_param_s": t_opt / n_params,
        "sharded_optimizer_overhead_s": sharded,
        "fsdp_overhead_s": fsdp,
        # runtime.hostspeed: every figure above is stated at the host speed where its probe takes
        # `probe_s` (each timed pass divided by the probe read before it); the readings
        "probe_s": ref if speed.readings else None,
        "probe_readings_s": speed.readings,
    }


def _gradients(model, autocast=None) -> None:
    """Real gradients in every parameter (one sample's backward), for an optimizer step to be
    timed on: Adam on zero gradients took 2.6 times as long as on these (17.0 against 6.6 ns a
    parameter, small-gpt, this host, 2026-11-23), which put its step 3 times over what the
    ranks of a run spend on it."""
    import torch

    model.zero_grad(set_to_none=True)
    x, y = model.sample_batch(1, generator=torch.Generator().manual_seed(1))
    with autocast() if autocast else _null():
        loss = model.loss(model(x), y)
    loss.backward()


def sharded_optimizer_step(
    model, repeats: int = 9, warmup: int = 2, speed: Callable[[], float] = _unit
) -> float | None:
    """Seconds of one Adam step on FSDP2's parameters on CPU at world size 1: over the same step
    on plain parameters, it is the overhead of DTensor's dispatch of every per-parameter op,
    which does not shrink with the shard. `model` is sharded in place (no copy: a large
    model's states would not fit twice). None when this process already has a process group
    (it is left alone)."""
    import torch
    import torch.distributed as dist
    from shardsim.runtime.launch import free_port
    from shardsim.runtime.strategies.fsdp import apply_fsdp
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        return None
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        sharded = apply_fsdp(model, init_device_mesh("cpu", (1,)))
        _gradients(sharded)
        step = torch.optim.Adam(sharded.parameters()).step
        return _median_time(step, repeats, warmup, lambda: None, speed)
    finally:
        dist.destroy_process_group()


def fsdp_overhead(
    ctx: _Ctx, batch: int, world: int, repeats: int = 9, warmup: int = 2, speed: Callable[[], float] = _unit
) -> tuple[float, float] | None:
    """(forward, backward) seconds of FSDP2's own work on a rank at world size `world`, one
    microbatch of `batch`: a copy of the model under FSDP2 (a unit per block, then the root)
    over the model as it is, passes alternating, the median of the differences. The
    collectives are PyTorch's fake process group's, which move nothing, so what is left is what
    FSDP2 itself does on the rank's thread: copying shards into the all-gather's buffer and the
    gathered unit out, gradients into the reduce-scatter's buffer, its hooks (CPU time of this
    thread; each pair's difference divided by `speed()` read before the pair). None when this
    process already has a process group (it is left alone).

    The fake collectives leave the gathered parameters as they found the memory: denormal
    numbers are flushed to zero meanwhile, so that garbage costs no more than numbers."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    from shardsim.runtime.strategies.fsdp import apply_fsdp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        return None
    plain = ctx.model
    x, y = plain.sample_batch(batch, generator=torch.Generator().manual_seed(0))
    flushed = torch.set_flush_denormal(True)
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        sharded = apply_fsdp(copy.deepcopy(plain), init_device_mesh("cpu", (world,)))

        def passes(model) -> tuple[float, float]:
            t0 = time.thread_time()
            with ctx.autocast():
                loss = model.loss(model(x), y)
            t1 = time.thread_time()
            loss.backward()
            t2 = time.thread_time()
            model.zero_grad(set_to_none=True)
            return t1 - t0, t2 - t1

        for _ in range(warmup):
            passes(plain), passes(sharded)
        fwd, bwd = [], []
        for _ in range(max(2 * repeats, 15)):
            s = speed()  # one reading for the pair: the difference is not divided by two readings' noise
            (pf, pb), (sf, sb) = passes(plain), passes(sharded)
            fwd.append((sf - pf) / s)
            bwd.append((sb - pb) / s)
        return max(0.0, statistics.median(fwd)), max(0.0, statistics.median(bwd))
    finally:
        dist.destroy_process_group()
        if flushed:
            torch.set_flush_denormal(False)


@dataclass
class _Ctx:
    model: object
    spec: object
    modules: list
    names: list[str]
    device: object
    sync: object
    autocast: object


def _setup(workload: str, device: str, threads: int, precision: str) -> _Ctx:
    import torch
    from shardsim.runtime.models.build import resolve_builder
    from shardsim.simulator.workload.model import load_workload

    torch.manual_seed(0)
    if device == "cpu":
        torch.set_num_threads(threads)
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    spec = load_workload(workload)
    model = resolve_builder(workload)().to(dev)
    model.train()
    dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    autocast = (lambda: torch.autocast(dev.type, dtype=dtype)) if dtype else (lambda: _null())
    modules = ([model.embed] if getattr(model, "embed", None) is not None else []) + list(model.blocks) + [model.head]
    names = [b.name for b in spec.blocks]
    if len(names) != len(modules):
        raise ConfigError(f"workload {workload!r}: {len(modules)} modules but the simulator sees {len(names)} blocks")
    return _Ctx(model, spec, modules, names, dev, sync, autocast)


def _block_times(ctx: _Ctx, batch: int, repeats: int, warmup: int, speed=_unit) -> dict[str, list[float]]:
    """[fwd_s, bwd_s] of every block for one microbatch of `batch` samples (a block's backward
    is seeded with a random output gradient; the head's with the loss)."""
    import torch

    g = torch.Generator().manual_seed(0)
    x, y = ctx.model.sample_batch(batch, generator=g)
    x, y = x.to(ctx.device), y.to(ctx.device)
    out: dict[str, list[float]] = {}
    act = x
    for name, mod in zip(ctx.names, ctx.modules, strict=True):
        inp = act.detach().requires_grad_(act.is_floating_point())
        with ctx.autocast():
            result = mod(inp)
        is_head = mod is ctx.model.head
        grad_out = None if is_head else torch.randn(result.shape, generator=g).to(ctx.device)

        def forward(inp=inp, is_head=is_head, mod=mod, grad_out=grad_out):
            with ctx.autocast():
                r = mod(inp)
                return ctx.model.loss(r, y) if is_head else (r.float() * grad_out).sum()

        out[name] = list(_fwd_bwd_times(forward, repeats, warmup, ctx.sync, speed))
        act = result.detach()
    return out


def _whole_times(ctx: _Ctx, batch: int, repeats: int, warmup: int, speed=_unit) -> tuple[float, float]:
    """(forward with the loss, backward) seconds of the whole model for one microbatch."""
    import torch

    x, y = ctx.model.sample_batch(batch, generator=torch.Generator().manual_seed(0))
    x, y = x.to(ctx.device), y.to(ctx.device)
    model = ctx.model

    def forward():
        with ctx.autocast():
            return model.loss(model(x), y)

    times = _fwd_bwd_times(forward, repeats, warmup, ctx.sync, speed)
    model.zero_grad(set_to_none=True)
    return times


def measure_core_sharing(workload: str, batch: int, ranks: Sequence[int], seconds: float = 0.6) -> dict[str, dict]:
    """What the host's cores give `n` processes computing at once, for each n in `ranks`.

    n forked processes, each on its own copy of the model (one torch thread), released
    together, run forward + backward iterations of the whole model, each after the host-speed
    probe, for a fixed wall time (about `seconds` of work each, alone):
    - `cpu_capacity`: the CPU seconds they got per wall second together while all of them
      ran (at most the core count: time slices lost to switching bring it below). A rate, not
      a fixed amount of work over the time until the last is done: the simulator shares the
      cores among the ranks computing at each moment, so the tail where fewer than the cores
      are still busy is its own to model (counted here too, it was charged twice: the old
      measure read 1.93-1.97 cores where this one reads 1.99-2.02, 4 and 8 processes on this
      quiet host, 2026-11-23);
    - `probe_inflation`: the probe's CPU time among them over one process alone (caches and
      memory bandwidth are shared: the same work takes more CPU time);
    - `effective_cores`: capacity / inflation (at least 1), the cores' worth of work they get;
    - `steal_share`: the part of the host's cores' time the hypervisor took meanwhile
      (runtime.hostspeed.Steal), which the capacity has lost: a run in another share scales it.
    Each is the median of 3 rounds, each round timing the process alone just before: a
    capacity is a ratio taken at one moment, which this drifting host does not spoil. Rounds
    in which the hypervisor took more than QUIET_STEAL_SHARE of the cores are set aside and
    another is timed (at most SHARING_ROUNDS_MAX in all; if none was quiet, the median of all)."""
    ctx = _cpu_ctx(workload)
    alone = _median_time(_model_step(ctx, batch), 3, 1, lambda: None)
    iters = max(1, round(seconds / alone))
    out: dict[str, dict] = {"cpu_capacity": {}, "probe_inflation": {}, "effective_cores": {}, "steal_share": {}}
    clock = StealClock()
    for n in sorted(set(ranks)):
        rounds: list[tuple[float, float, float]] = []  # (capacity, inflation, steal share)
        while len(rounds) < SHARING_ROUNDS_MAX and sum(r[2] <= QUIET_STEAL_SHARE for r in rounds) < 3:
            _, _, probe_alone = _forked_cpu(ctx, batch, iters, 1)
            clock.start()
            capacity, probe = _forked_rate(ctx, batch, iters * alone * n / (os.cpu_count() or 1), n)
            steal = clock.stop()
            rounds.append((capacity, probe / probe_alone, steal.share if steal else 0.0))
        rounds = [r for r in rounds if r[2] <= QUIET_STEAL_SHARE] or rounds
        cap, inf, stolen = (statistics.median(r[k] for r in rounds) for k in range(3))
        out["cpu_capacity"][str(n)] = cap
        out["probe_inflation"][str(n)] = inf
        out["steal_share"][str(n)] = stolen
        # below 1 it is the host's drift between the two timings: sharing caches never speeds work up
        out["effective_cores"][str(n)] = cap / max(inf, 1.0)
    return out


def _forked_cpu(ctx: _Ctx, batch: int, iters: int, n: int, probed: bool = True) -> tuple[float, float, float]:
    """(wall seconds until all are done, their CPU seconds together, the probe's mean; NaN
    unless `probed`) of `n` forked processes, each on its own copy of the model, released
    together, each running a forward + backward `iters` times (after the probe, if `probed`)."""
    import multiprocessing as mp

    fork = mp.get_context("fork")
    barrier, results = fork.Barrier(n + 1), fork.Queue()
    args = (ctx, batch, iters, barrier, results, probed)
    procs = [fork.Process(target=_forked_worker, args=args) for _ in range(n)]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    got = [results.get() for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    return wall, sum(c for c, _ in got), statistics.fmean(p for _, p in got)


def _forked_rate(ctx: _Ctx, batch: int, seconds: float, n: int) -> tuple[float, float]:
    """(the CPU seconds per wall second `n` forked processes got together, the probe's mean):
    each on its own copy of the model, released together, each running the probe and a forward
    + backward in turn until `seconds` have passed, when it reads its CPU and wall clocks."""
    import multiprocessing as mp

    fork = mp.get_context("fork")
    barrier, results = fork.Barrier(n + 1), fork.Queue()
    procs = [fork.Process(target=_rate_worker, args=(ctx, batch, seconds, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    barrier.wait()
    got = [results.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(cpu / wall for cpu, wall, _ in got), statistics.fmean(p for _, _, p in got)


def _rate_worker(ctx: _Ctx, batch: int, seconds: float, barrier, results) -> None:
    import signal

    work, probe = _model_step(ctx, batch, private=True), Probe()
    work()
    read: list[float] = []

    def alarm(signum, frame) -> None:  # runs between two torch calls: the clocks are read at once
        read.extend((time.process_time() - c0, time.perf_counter() - t0))

    signal.signal(signal.SIGALRM, alarm)
    barrier.wait()
    t0, c0, probes = time.perf_counter(), time.process_time(), []
    signal.setitimer(signal.ITIMER_REAL, seconds)
    while not probes or not read:  # at least one probe, however short the time
        probes.append(probe())
        work()
    results.put((read[0], read[1], statistics.fmean(probes)))


def _forked_worker(ctx: _Ctx, batch: int, iters: int, barrier, results, probed: bool) -> None:
    work, probe = _model_step(ctx, batch, private=True), (Probe() if probed else None)
    work()
    barrier.wait()
    c0, probes = time.process_time(), []
    for _ in range(iters):
        if probe is not None:
            probes.append(probe())
        work()
    results.put((time.process_time() - c0, statistics.fmean(probes) if probes else math.nan))


def _model_step(ctx: _Ctx, batch: int, private: bool = False):
    """Forward + backward of the whole model. `private`: on a copy of the model and batch, so
    that a forked process works on memory of its own, as a rank does (pages shared with the
    parent would share the caches too and flatter the sharing)."""
    import copy

    import torch

    x, y = ctx.model.sample_batch(batch, generator=torch.Generator().manual_seed(0))
    model = copy.deepcopy(ctx.model) if private else ctx.model
    if private:
        x, y = x.clone(), y.clone()

    def step():
        model.loss(model(x), y).backward()
        model.zero_grad(set_to_none=True)

    return step


def measure_links(topology: str, nodes: int | None = None, timeout_s: float = 120.0) -> dict[str, float]:
    """Bring the emulated cluster up and measure, under torchrun in the cluster
    (`runtime.linkbench`), the loopback inside a node as gloo's all-gather gets it with every
    node gathering at once, and a node's NIC as gloo's ring over all ranks gets it (`nic_Bps`,
    `nic_latency_s`, what the simulator uses), and the CPU seconds a rank spends per byte it
    sends in an all-gather and an all-reduce over all ranks (`*_cpu_s_per_B`). One TCP stream
    node 0 → node 1 and one inside node 0 are measured too (`nic_tcp_*`, `loopback_tcp_*`):
    for reference, and their latency is the least a ring step can take. Needs root."""
    import subprocess

    from shardsim.runtime.emulation.cluster import emulated, measure_link, plan_cluster, run_in_node, torchrun_argv
    from shardsim.runtime.launch import free_port

    cluster = plan_cluster(topology, nodes)
    out: dict[str, float] = {}
    with emulated(cluster), tempfile.TemporaryDirectory(prefix="shardsim-linkbench-") as tmp:
        if len(cluster.nodes) > 1:
            nic = measure_link(cluster, 0, 1)
            out |= {"nic_tcp_Bps": nic.bandwidth_Bps, "nic_tcp_latency_s": nic.latency_s}
        lo = measure_link(cluster, 0, 0)
        out |= {"loopback_tcp_Bps": lo.bandwidth_Bps, "loopback_tcp_latency_s": lo.latency_s}
        result = Path(tmp) / "loopback.json"
        port = free_port()
        env = {"OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
        argv = ["-m", "shardsim.runtime.profile.linkbench", str(result)]
        procs = [
            run_in_node(
                cluster,
                i,
                torchrun_argv(cluster, i, argv, master_port=port),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            for i in range(len(cluster.nodes))
        ]
        try:
            errs = [p.communicate(timeout=timeout_s)[1] for p in procs]
        except subprocess.TimeoutExpired:
            raise ConfigError(f"timing gloo inside the nodes of {topology} took over {timeout_s:g} s") from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(p.returncode for p in procs) or not result.exists():
            why = next((e.decode(errors="replace").strip().splitlines()[-1] for e in errs if e.strip()), "no output")
            raise ConfigError(f"timing gloo inside the nodes of {topology} failed: {why}")
        lb = json.loads(result.read_text())
    return out | ring_figures(lb, lo.latency_s, out.get("nic_tcp_latency_s"))


def ring_figures(bench: dict, loopback_tcp_latency_s: float, nic_tcp_latency_s: float | None) -> dict[str, float]:
    """The link figures the simulator uses, from `runtime.linkbench`'s fits. A ring step takes
    at least a one-way trip over its link, so a fit's per-step cost (clamped at 0 when the
    small size went at the full rate, as it can with tbf's bucket) is floored at the TCP probe's.
    The CPU a rank spends per byte it sends passes through as measured."""
    out = {"loopback_Bps": bench["loopback_Bps"]}
    out |= {k: bench[k] for k in ("gather_cpu_s_per_B", "reduce_cpu_s_per_B") if k in bench}
    out["loopback_latency_s"] = max(bench["loopback_latency_s"], loopback_tcp_latency_s)
    if "nic_ring_Bps" in bench and nic_tcp_latency_s is not None:
        out |= {"nic_Bps": bench["nic_ring_Bps"], "nic_latency_s": max(bench["nic_ring_latency_s"], nic_tcp_latency_s)}
    return out


def build_profile(
    workload: str,
    batches: Sequence[int],
    *,
    device: str = "cpu",
    threads: int = 1,
    repeats: int = 9,
    precision: str = "fp32",
    topologies: Sequence[tuple[str, int | None]] = (),
    ranks: Sequence[int] = (),
) -> dict:
    """A whole profile: blocks at each microbatch size; for each emulated topology its measured
    links; and the cores that each count of ranks in `ranks` really gets on this host."""
    host = ranks and device == "cpu"
    # the host's speed while the blocks were timed: yardsticks before and after them and at the
    # end, averaged (this host flips between a fast and a slow state every few seconds)
    yards = [yardstick(workload, max(batches))] if host else []
    doc = profile_workload(
        workload,
        batches,
        device=device,
        threads=threads,
        repeats=repeats,
        precision=precision,
        fsdp_world=max(ranks, default=FSDP_WORLD),
    )
    if host:
        yards.append(yardstick(workload, max(batches)))
    if topologies:
        doc["links"] = {name: measure_links(name, nodes) for name, nodes in topologies}
    if host:
        sharing = measure_core_sharing(workload, max(batches), ranks)
        yards.append(yardstick(workload, max(batches)))
        doc["host"] = {
            "cores": os.cpu_count(),
            **sharing,
            "yardstick_all_cores_s": statistics.fmean(yards),
            "yardsticks_s": yards,
        }
    return doc


@functools.lru_cache(maxsize=4)
def _cpu_ctx(workload: str) -> _Ctx:
    """The workload set up on the CPU, one thread, fp32: built once for core sharing and yardsticks."""
    return _setup(workload, "cpu", 1, "fp32")


def yardstick(workload: str, batch: int, *, iters: int = 3, rounds: int = 2) -> float:
    """How fast this host is right now, as all its cores are: one forked process per core, each
    on its own copy of the model, runs `iters` forward + backward passes of the whole model (one
    thread), released together; the wall time until all are done / `iters`, the mean of
    `rounds` such rounds.

    All cores, not one process alone: this shared VM's cores drift apart, each switching
    between about 0.33 and 0.47 s for the same pass within seconds (measured), so one process
    alone times whichever core it lands on. The ranks of an emulated cluster use every core."""
    ctx, procs = _cpu_ctx(workload), os.cpu_count() or 1
    return statistics.fmean(_forked_cpu(ctx, batch, iters, procs, probed=False)[0] / iters for _ in range(rounds))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def write_json_atomic(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=2)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _batches(text: str | None, default: int) -> list[int]:
    if not text:
        return [default]
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"expected microbatch sizes like 2,4, got {text!r}", field="batch") from None
    if not out or min(out) < 1:
        raise ConfigError(f"expected microbatch sizes >= 1, got {text!r}", field="batch")
    return out


def _cmd_profile(ns: argparse.Namespace) -> int:
    from shardsim.simulator.hardware.topology import make_cluster

    cfg = config_from_args(ns)
    out = Path(ns.out)
    if out.exists() and out.is_dir():
        raise ConfigError(f"--out {out} is a folder; expected a file path")
    if ns.repeats < 1:
        raise ConfigError(f"expected --repeats >= 1, got {ns.repeats}", field="repeats")
    batches = _batches(ns.batch, cfg.batch_per_device)
    cluster = make_cluster(cfg.topology, cfg.nodes)
    emulated = cluster.instance.emulated is not None
    links = emulated if ns.links is None else ns.links
    if links:
        from shardsim.runtime.emulation.cluster import check_privileges

        if not emulated:
            raise ConfigError(f"topology {cluster.instance.name!r} is not emulated: its links cannot be measured here")
        try:
            check_privileges()
        except ConfigError as exc:
            raise ConfigError(f"{exc} (or pass --no-links to profile the blocks only)") from None
    device = ns.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    sharing = emulated and device == "cpu" if ns.sharing is None else ns.sharing
    doc = build_profile(
        cfg.workload,
        batches,
        device=device,
        threads=ns.threads,
        repeats=ns.repeats,
        precision=cfg.precision,
        topologies=[(cluster.instance.name, cluster.nodes)] if links else [],
        ranks=[cluster.world] if sharing else [],
    )
    write_json_atomic(out, doc)
    if ns.json:
        print(json.dumps(doc))
        return 0
    for b, table in doc["blocks_by_batch_s"].items():
        total_f = sum(v[0] for v in table.values())
        total_b = sum(v[1] for v in table.values())
        print(f"{cfg.workload} on {doc['device']}, microbatch {b}: forward {total_f * 1e3:.2f} ms, "
              f"backward {total_b * 1e3:.2f} ms")  # fmt: skip
    print(f"Adam {doc['optimizer_per_param_s'] * 1e9:.2f} ns/param", end="")
    so = doc.get("sharded_optimizer_overhead_s")
    print("" if so is None else f", +{so * 1e3:.1f} ms a step on FSDP2's sharded parameters")
    if fo := doc.get("fsdp_overhead_s"):
        print(f"FSDP2's own work at {fo['world']} ranks: +{fo['fwd_s'] * 1e3:.1f} ms a forward, "
              f"+{fo['bwd_s'] * 1e3:.1f} ms a backward")  # fmt: skip
    for name, lp in doc.get("links", {}).items():
        nic = ""
        if "nic_Bps" in lp:
            nic = f"NIC {lp['nic_Bps'] * 8 / 1e6:.1f} Mbit/s, {lp['nic_latency_s'] * 1e6:.0f} us a ring step"
            nic += f" (one TCP stream: {lp['nic_tcp_Bps'] * 8 / 1e6:.1f} Mbit/s); " if "nic_tcp_Bps" in lp else "; "
        print(f"{name}: {nic}loopback {lp['loopback_Bps'] / 1e9:.2f} GB/s, {lp['loopback_latency_s'] * 1e6:.0f} us")
        if "gather_cpu_s_per_B" in lp:
            print(f"  moving a byte costs {lp['gather_cpu_s_per_B'] * 1e9:.2f} ns of CPU (all-gather), "
                  f"{lp['reduce_cpu_s_per_B'] * 1e9:.2f} ns (all-reduce)")  # fmt: skip
    host = doc.get("host", {})
    for n, c in host.get("effective_cores", {}).items():
        cap, infl = host.get("cpu_capacity", {}).get(n), host.get("probe_inflation", {}).get(n)
        more = "" if cap is None else f" ({cap:.2f} cores of CPU time, work costing {infl:.2f}x the CPU alone)"
        print(f"{n} ranks computing at once get {c:.2f} of the host's {host['cores']} cores{more}")
    if doc.get("probe_s"):
        print(f"every figure at the host speed where the probe takes {doc['probe_s'] * 1e3:.2f} ms")
    print(f"written {out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "profile", help="measure the workload's blocks on this machine's device (and an emulated cluster's links)"
    )
    add_config_arguments(p)
    p.add_argument("--out", default="results/profile.json", help="profile file to write")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--threads", type=int, default=1, help="torch threads (one per rank on CPU)")
    p.add_argument("--batch", default=None, help="microbatch sizes to time, e.g. 2,4 (default: batch_per_device)")
    p.add_argument("--repeats", type=int, default=9, help="timings per figure (the median is kept)")
    p.add_argument(
        "--links",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure the emulated cluster's NIC and loopback (needs root; default: for an emulated topology)",
    )
    p.add_argument(
        "--sharing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure the cores the cluster's ranks really get when all compute (default: emulated, CPU)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_profile)
