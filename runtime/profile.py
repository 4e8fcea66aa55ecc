"""`shardsim profile`: measure a workload's blocks on the local device.

Times each block's forward and backward (and the Adam step per parameter) with real
tensors at the configured batch, one torch thread per rank on CPU as the runtime uses,
and writes a profile that `predict`, `sweep` and `validate` take with `--profile`.
The simulator scales the per-sample times linearly with the microbatch, so profile at
the microbatch size you will predict.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from simulator.config import add_config_arguments, config_from_args
from simulator.errors import ConfigError


def _median_time(fn, repeats: int, warmup: int, sync) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def profile_workload(
    workload: str,
    batch: int | Sequence[int],
    *,
    device: str = "cpu",
    threads: int = 1,
    repeats: int = 5,
    warmup: int = 2,
    precision: str = "fp32",
) -> dict:
    """Forward/backward seconds of every block at each microbatch size in `batch` (per
    microbatch, and per sample at the first size), and Adam seconds per parameter."""
    import torch

    batches = sorted({batch} if isinstance(batch, int) else set(batch))
    ctx = _setup(workload, device, threads, precision)
    by_batch = {str(b): _block_times(ctx, b, repeats, warmup) for b in batches}
    model = ctx.model
    opt = torch.optim.Adam(model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    n_params = sum(p.numel() for p in model.parameters())
    t_opt = _median_time(opt.step, repeats, warmup, ctx.sync)
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
        "blocks_per_sample_s": {k: [f / first, b / first] for k, (f, b) in by_batch[str(first)].items()},
        "optimizer_per_param_s": t_opt / n_params,
    }


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

    from runtime.workloads import resolve_builder
    from simulator.workload import load_workload

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


def _block_times(ctx: _Ctx, batch: int, repeats: int, warmup: int) -> dict[str, list[float]]:
    """[fwd_s, bwd_s] of every block for one microbatch of `batch` samples."""
    import torch

    g = torch.Generator().manual_seed(0)
    x, y = ctx.model.sample_batch(batch, generator=g)
    x, y = x.to(ctx.device), y.to(ctx.device)
    out: dict[str, list[float]] = {}
    act = x
    for name, mod in zip(ctx.names, ctx.modules, strict=True):
        inp = act.detach().requires_grad_(act.is_floating_point())
        with ctx.autocast():
            fwd = _median_time(lambda m=mod, i=inp: m(i), repeats, warmup, ctx.sync)
            result = mod(inp)
        is_head = mod is ctx.model.head
        grad_out = None if is_head else torch.randn(result.shape, generator=g).to(ctx.device)

        def backward(inp=inp, is_head=is_head, mod=mod, grad_out=grad_out):
            with ctx.autocast():
                r = mod(inp)
                loss = ctx.model.loss(r, y) if is_head else (r.float() * grad_out).sum()
            loss.backward()

        # backward time = (forward + backward) - forward, measured on the same inputs
        both = _median_time(backward, repeats, warmup, ctx.sync)
        out[name] = [fwd, max(both - fwd, 0.0)]
        act = result.detach()
    return out


def measure_core_sharing(workload: str, batch: int, ranks: Sequence[int], seconds: float = 2.0) -> dict[str, float]:
    """Cores that `n` processes computing at once really get, for each n in `ranks`.

    Every process (forked, one torch thread) runs forward + backward of one of the workload's
    layers for `seconds`; effective cores = the iterations of all n together / those of one
    process alone in the same time. With n above the core count this is below the count:
    processes on shared cores also share caches and memory bandwidth, and switch."""
    import multiprocessing as mp

    ctx = _setup(workload, "cpu", 1, "fp32")
    work = _layer_step(ctx, batch)
    for _ in range(3):
        work()
    alone = _iterations(work, seconds)
    fork = mp.get_context("fork")
    out = {}
    for n in sorted(set(ranks)):
        barrier = fork.Barrier(n)
        queue = fork.Queue()
        procs = [fork.Process(target=_sharing_worker, args=(work, seconds, barrier, queue)) for _ in range(n)]
        for p in procs:
            p.start()
        counts = [queue.get(timeout=seconds * 10 + 60) for _ in procs]
        for p in procs:
            p.join()
        out[str(n)] = sum(counts) / alone
    return out


def _layer_step(ctx: _Ctx, batch: int):
    import torch

    layer_idx = next((i for i, b in enumerate(ctx.spec.blocks) if b.kind == "layer"), 0)
    x, _ = ctx.model.sample_batch(batch, generator=torch.Generator().manual_seed(0))
    act = x
    for mod in ctx.modules[:layer_idx]:
        act = mod(act).detach()
    layer = ctx.modules[layer_idx]
    inp = act.detach().requires_grad_(act.is_floating_point())

    def step():
        layer(inp).float().sum().backward()

    return step


def _iterations(work, seconds: float) -> float:
    """Iterations of `work` per `seconds` (fractional: the last one counts by its share)."""
    n, t0 = 0, time.perf_counter()
    while True:
        work()
        n += 1
        t = time.perf_counter() - t0
        if t >= seconds:
            return n * seconds / t


def _sharing_worker(work, seconds: float, barrier, queue) -> None:
    work()
    barrier.wait()
    queue.put(_iterations(work, seconds))


def measure_links(topology: str, nodes: int | None = None) -> dict[str, float]:
    """Bring the emulated cluster up and measure a node's NIC (node 0 → node 1) and the
    loopback between two processes of node 0 (needs root)."""
    from runtime.emulation import emulated, measure_link, plan_cluster

    cluster = plan_cluster(topology, nodes)
    with emulated(cluster):
        nic = measure_link(cluster, 0, 1) if len(cluster.nodes) > 1 else None
        lo = measure_link(cluster, 0, 0, size_bytes=200_000_000, warmup_bytes=20_000_000)
    out = {"loopback_Bps": lo.bandwidth_Bps, "loopback_latency_s": lo.latency_s}
    if nic is not None:
        out |= {"nic_Bps": nic.bandwidth_Bps, "nic_latency_s": nic.latency_s}
    return out


def build_profile(
    workload: str,
    batches: Sequence[int],
    *,
    device: str = "cpu",
    threads: int = 1,
    repeats: int = 5,
    precision: str = "fp32",
    topologies: Sequence[tuple[str, int | None]] = (),
    ranks: Sequence[int] = (),
) -> dict:
    """A whole profile: blocks at each microbatch size; for each emulated topology its measured
    links; and the cores that each count of ranks in `ranks` really gets on this host."""
    doc = profile_workload(workload, batches, device=device, threads=threads, repeats=repeats, precision=precision)
    if topologies:
        doc["links"] = {name: measure_links(name, nodes) for name, nodes in topologies}
    if ranks and doc["device"] == "cpu":
        doc["host"] = {
            "cores": os.cpu_count(),
            "effective_cores": measure_core_sharing(workload, max(batches), ranks),
        }
    return doc


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
    from simulator.topology import make_cluster

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
        from runtime.emulation import check_privileges

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
    print(f"Adam {doc['optimizer_per_param_s'] * 1e9:.2f} ns/param")
    for name, lp in doc.get("links", {}).items():
        nic = (
            f"NIC {lp['nic_Bps'] * 8 / 1e6:.1f} Mbit/s, {lp['nic_latency_s'] * 1e6:.0f} us; " if "nic_Bps" in lp else ""
        )
        print(f"{name}: {nic}loopback {lp['loopback_Bps'] / 1e9:.2f} GB/s, {lp['loopback_latency_s'] * 1e6:.0f} us")
    for n, c in doc.get("host", {}).get("effective_cores", {}).items():
        print(f"{n} ranks computing at once get {c:.2f} of the host's {doc['host']['cores']} cores")
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
    p.add_argument("--repeats", type=int, default=5)
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
