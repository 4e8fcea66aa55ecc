"""The `shardsim` command. Subcommands register themselves; torch is imported only by
subcommands that need it (run, a model given by import path)."""

from __future__ import annotations

import argparse
import json
import sys

from shardsim.simulator.errors import ConfigError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _cmd_collective(ns: argparse.Namespace) -> int:
    from shardsim.simulator.collective import simulate_collective
    from shardsim.simulator.hardware.topology import make_cluster
    from shardsim.simulator.units import format_bytes, format_seconds, parse_size

    size = parse_size(ns.size, field="--size")
    cluster = make_cluster(ns.topology, ns.nodes)
    r = simulate_collective(cluster, ns.op, size, ns.algo, ns.backend, ns.ranks)
    if ns.json:
        print(
            json.dumps({k: getattr(r, k) for k in ("op", "ranks", "size_bytes", "time_s", "algbw_GBps", "busbw_GBps")})
        )
        return 0
    print(f"{r.op} of {format_bytes(r.size_bytes)} over {r.ranks} ranks on {r.cluster} ({r.algo}, {r.backend})")
    print(f"  time   {format_seconds(r.time_s)}")
    print(f"  algbw  {r.algbw_GBps:.2f} GB/s")
    print(f"  busbw  {r.busbw_GBps:.2f} GB/s")
    return 0


def _cmd_topologies(ns: argparse.Namespace) -> int:
    from shardsim.simulator.hardware.topology import builtin_topologies, load_instance

    for name in builtin_topologies():
        inst = load_instance(name)
        d, nic = inst.device, inst.nic
        price = f"${inst.price_per_hour_usd:.3f}/h" if inst.price_per_hour_usd else "no price"
        print(
            f"{name:16s} {d.count} x {d.model} {d.memory_gib:g} GiB, {inst.fabric.kind} "
            f"{inst.fabric.port_GBps:g} GB/s, {nic.count} x {nic.rate_gbps:g} Gbps, {price}"
        )
    return 0


def _cmd_workloads(ns: argparse.Namespace) -> int:
    from shardsim.simulator.workload.model import PRESETS, load_workload

    for name in PRESETS:
        w = load_workload(name)
        print(
            f"{name:12s} {w.params / 1e6:10.1f} M params  {len(w.blocks):3d} blocks  "
            f"{w.train_flops / 1e9:12.2f} GFLOP/sample"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="shardsim", description="Topology-aware performance simulator for distributed training.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("collective", help="time one collective on a cluster (nccl-tests style)")
    c.add_argument("--topology", default="p4d.24xlarge", help="instance type or YAML path")
    c.add_argument("--nodes", type=int, default=None, help="number of nodes (default 1, or the emulated count)")
    c.add_argument(
        "--op", default="all_reduce", choices=("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv")
    )
    c.add_argument("--size", default="1GiB", help="message size S as nccl-tests counts it, e.g. 1GiB, 25MB")
    c.add_argument("--algo", default="ring", choices=("ring", "tree", "hierarchical"))
    c.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    c.add_argument("--ranks", type=int, default=None, help="use only the first N ranks")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=_cmd_collective)

    t = sub.add_parser("topologies", help="list the shipped instance types")
    t.set_defaults(func=_cmd_topologies)
    w = sub.add_parser("workloads", help="list the workload presets")
    w.set_defaults(func=_cmd_workloads)

    subcommands = (
        "shardsim.simulator.predict_cli",
        "shardsim.simulator.sweep.cli",
        "shardsim.runtime.run_cli",
        "shardsim.runtime.profile.cli",
        "shardsim.runtime.emulation.cli",
        "shardsim.runtime.validation.validate",
    )
    for module in subcommands:
        try:
            mod = __import__(module, fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        mod.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return int(ns.func(ns) or 0)
    except ConfigError as exc:
        print(f"shardsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("shardsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
