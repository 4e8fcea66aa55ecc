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
    batch: int,
    *,
    device: str = "cpu",
    threads: int = 1,
    repeats: int = 5,
    warmup: int = 2,
    precision: str = "fp32",
) -> dict:
    """Per-sample forward/backward seconds of every block, and Adam seconds per parameter."""
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
    g = torch.Generator().manual_seed(0)
    x, y = model.sample_batch(batch, generator=g)
    x, y = x.to(dev), y.to(dev)
    modules = ([model.embed] if getattr(model, "embed", None) is not None else []) + list(model.blocks) + [model.head]
    names = [b.name for b in spec.blocks]
    if len(names) != len(modules):
        raise ConfigError(f"workload {workload!r}: {len(modules)} modules but the simulator sees {len(names)} blocks")
    out: dict[str, list[float]] = {}
    act = x
    for name, mod in zip(names, modules, strict=True):
        inp = act.detach().requires_grad_(act.is_floating_point())
        with autocast():
            fwd = _median_time(lambda m=mod, i=inp: m(i), repeats, warmup, sync)
            result = mod(inp)
        is_head = mod is model.head
        grad_out = None if is_head else torch.randn(result.shape, generator=g).to(dev)

        def backward(inp=inp, is_head=is_head, mod=mod, grad_out=grad_out):
            with autocast():
                r = mod(inp)
                loss = model.loss(r, y) if is_head else (r.float() * grad_out).sum()
            loss.backward()

        # backward time = (forward + backward) - forward, measured on the same inputs
        both = _median_time(backward, repeats, warmup, sync)
        out[name] = [fwd / batch, max(both - fwd, 0.0) / batch]
        act = result.detach()
    opt = torch.optim.Adam(model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    n_params = sum(p.numel() for p in model.parameters())
    t_opt = _median_time(opt.step, repeats, warmup, sync)
    return {
        "workload": workload,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "threads": threads if dev.type == "cpu" else None,
        "batch": batch,
        "precision": precision,
        "torch": torch.__version__,
        "blocks_per_sample_s": out,
        "optimizer_per_param_s": t_opt / n_params,
    }


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


def _cmd_profile(ns: argparse.Namespace) -> int:
    cfg = config_from_args(ns)
    out = Path(ns.out)
    if out.exists() and out.is_dir():
        raise ConfigError(f"--out {out} is a folder; expected a file path")
    device = ns.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    batch = ns.batch or cfg.batch_per_device
    doc = profile_workload(
        cfg.workload, batch, device=device, threads=ns.threads, repeats=ns.repeats, precision=cfg.precision
    )
    write_json_atomic(out, doc)
    if ns.json:
        print(json.dumps(doc))
    else:
        total_f = sum(v[0] for v in doc["blocks_per_sample_s"].values()) * batch
        total_b = sum(v[1] for v in doc["blocks_per_sample_s"].values()) * batch
        print(
            f"{cfg.workload} on {doc['device']}, batch {batch}: forward {total_f * 1e3:.2f} ms, "
            f"backward {total_b * 1e3:.2f} ms, Adam {doc['optimizer_per_param_s'] * 1e9:.2f} ns/param → {out}"
        )
    return 0


def register(sub) -> None:
    p = sub.add_parser("profile", help="measure the workload's blocks on this machine's device")
    add_config_arguments(p)
    p.add_argument("--out", default="results/profile.json", help="profile file to write")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--threads", type=int, default=1, help="torch threads (one per rank on CPU)")
    p.add_argument("--batch", type=int, default=None, help="samples per measurement (default: batch_per_device)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_profile)
