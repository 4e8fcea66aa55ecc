"""`shardsim topologies`: the shipped instance types, a line each."""

from __future__ import annotations

import argparse


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


def register(sub) -> None:
    t = sub.add_parser(
        "topologies",
        help="list the shipped instance types",
        description="List the shipped instance types: devices, intra-node fabric, NICs, price.",
    )
    t.set_defaults(func=_cmd_topologies)
