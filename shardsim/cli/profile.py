"""`shardsim profile`: its arguments, and what it prints after writing the profile."""

from __future__ import annotations

import argparse
import contextlib
import json

from shardsim.cli.inputs import config_inputs
from shardsim.config import add_config_arguments, config_from_args
from shardsim.core.errors import ConfigError
from shardsim.core.files import check_output_file
from shardsim.core.flagtypes import Count, CountList
from shardsim.core.torch_required import require_torch
from shardsim.core.units import format_seconds
from shardsim.runtime.profile.build import build_profile, write_json_atomic
from shardsim.runtime.train import MAX_THREADS
from shardsim.specs.bounds import MAX_BATCH

MAX_REPEATS = 1_000  # timings of one figure


def _device(asked: str) -> str:
    """Where the blocks are timed: `asked`, auto as CUDA when present; cuda without a CUDA device is refused."""
    import torch

    if asked == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if asked == "cuda" and not torch.cuda.is_available():
        raise ConfigError("this machine has no CUDA device torch can use (pass --device cpu)", field="device")
    return asked


def _cmd_profile(ns: argparse.Namespace) -> int:
    from shardsim.specs.hardware.topology import make_cluster

    require_torch("shardsim profile")
    cfg = config_from_args(ns)
    if not isinstance(cfg.workload, str):
        raise ConfigError(
            "profile times a named model or a model file; write the mapping to a file and pass its path",
            where=cfg.source,
            field="workload",
        )
    if cfg.shape.given():
        name = next(iter(cfg.shape.given()))
        raise ConfigError(
            "profile times the model as its file defines it; write a model file with that shape",
            where=cfg.source,
            field=name,
        )
    device = _device(ns.device)
    tp, sp = cfg.strategy.tp, cfg.strategy.sequence_parallel
    if tp > 1 and device != "cpu":
        raise ConfigError("a tensor-parallel rank's share is timed on CPU ranks only (pass --device cpu)", field="tp")
    out = check_output_file(ns.out, "out", inputs=config_inputs(ns, cfg))
    batches = list(ns.batch or (cfg.batch_per_device,))
    cluster = make_cluster(cfg.topology, cfg.nodes)
    emulated = cluster.instance.emulated is not None
    links = emulated if ns.links is None else ns.links
    if links:
        from shardsim.runtime.emulation.iproute import check_privileges

        if not emulated:
            raise ConfigError(f"topology {cluster.instance.name!r} is not emulated: its links cannot be measured here")
        try:
            check_privileges()
        except ConfigError as exc:
            raise ConfigError(f"{exc} (or pass --no-links to profile the blocks only)") from None
    sharing = emulated and device == "cpu" if ns.sharing is None else ns.sharing
    holding = contextlib.nullcontext()
    if links:  # the links are measured in the emulated cluster: hold it for the whole job
        from shardsim.runtime.emulation.namespaces import held
        from shardsim.runtime.emulation.plan import plan_cluster

        holding = held([plan_cluster(cluster.instance, cluster.nodes)], wait=ns.wait)
    with holding:
        doc = build_profile(
            cfg.workload,
            batches,
            device=device,
            threads=ns.threads,
            repeats=ns.repeats,
            precision=cfg.precision,
            topologies=[(cluster.instance.name, cluster.nodes)] if links else [],
            ranks=[cluster.world] if sharing else [],
            tp_layouts=[(tp, sp)] if tp > 1 else [],
        )
    write_json_atomic(out, doc)
    if ns.json:
        print(json.dumps(doc))
        return 0
    for b, table in doc["blocks_by_batch_s"].items():
        total_f = sum(v[0] for v in table.values())
        total_b = sum(v[1] for v in table.values())
        print(f"{cfg.workload} on {doc['device']}, microbatch {b}: forward {format_seconds(total_f)}, "
              f"backward {format_seconds(total_b)}")  # fmt: skip
    print(f"Adam {format_seconds(doc['optimizer_per_param_s'])} a parameter", end="")
    so = doc.get("sharded_optimizer_overhead_s")
    print("" if so is None else f", +{format_seconds(so)} a step on FSDP2's sharded parameters")
    if fo := doc.get("fsdp_overhead_s"):
        print(f"FSDP2's own work at {fo['world']} ranks: +{format_seconds(fo['fwd_s'])} a forward, "
              f"+{format_seconds(fo['bwd_s'])} a backward")  # fmt: skip
    for b, shares in (doc.get("tp_share_by_batch") or {}).items():
        for key, (f, w) in shares.items():
            print(f"a tensor-parallel rank ({key}), microbatch {b}: {f:.2f} of the forward, {w:.2f} of the backward")
    for name, lp in doc.get("links", {}).items():
        nic = ""
        if "nic_Bps" in lp:
            nic = f"NIC {lp['nic_Bps'] * 8 / 1e6:.1f} Mbit/s, {format_seconds(lp['nic_latency_s'])} a ring step"
            nic += f" (one TCP stream: {lp['nic_tcp_Bps'] * 8 / 1e6:.1f} Mbit/s); " if "nic_tcp_Bps" in lp else "; "
        print(f"{name}: {nic}loopback {lp['loopback_Bps'] / 1e9:.2f} GB/s, {format_seconds(lp['loopback_latency_s'])}")
        if "gather_cpu_s_per_B" in lp:
            print(f"  moving a byte costs {format_seconds(lp['gather_cpu_s_per_B'])} of CPU (all-gather), "
                  f"{format_seconds(lp['reduce_cpu_s_per_B'])} (all-reduce)")  # fmt: skip
    host = doc.get("host", {})
    for n, c in host.get("effective_cores", {}).items():
        cap, infl = host.get("cpu_capacity", {}).get(n), host.get("probe_inflation", {}).get(n)
        more = "" if cap is None else f" ({cap:.2f} cores of CPU time, work costing {infl:.2f}x the CPU alone)"
        print(f"{n} ranks computing at once get {c:.2f} of the host's {host['cores']} cores{more}")
    if doc.get("probe_s"):
        print(f"every figure at the host speed where the probe takes {format_seconds(doc['probe_s'])}")
    print(f"written {out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="measure the workload's blocks on this machine's device (and an emulated cluster's links)",
        description="Measure on this machine what a prediction needs: the forward and backward of the workload's "
        "layers, embedding and head at each microbatch size, Adam, FSDP2's own work, the cores ranks really get "
        "and, for an emulated topology, its NIC and loopback links. Write them as a profile that predict, sweep and "
        "validate take with --profile.",
    )
    add_config_arguments(p)
    p.add_argument(
        "--out",
        default="results/profile.json",
        help="profile file to write, its folder made if missing (default: %(default)s)",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="where the blocks are timed; auto: CUDA when present, else the CPU (default: %(default)s)",
    )
    p.add_argument(
        "--threads",
        type=Count(MAX_THREADS),
        default=1,
        help="torch threads, as one rank on CPU uses (default: %(default)s)",
    )
    p.add_argument(
        "--batch",
        type=CountList(MAX_BATCH),
        default=None,
        help="microbatch sizes to time, e.g. 2,4 (default: batch_per_device)",
    )
    p.add_argument(
        "--repeats",
        type=Count(MAX_REPEATS),
        default=9,
        help="timings per figure, the median kept (default: %(default)s)",
    )
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
    p.add_argument(
        "--wait",
        action="store_true",
        help="when another job holds the emulated topology, wait for it (default: refuse, exit 2)",
    )
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    p.set_defaults(func=_cmd_profile)
