"""`shardsim topologies`: the shipped instance types, a row each."""

from __future__ import annotations

import argparse


def _cmd_topologies(ns: argparse.Namespace) -> int:
    from shardsim.core.console import console
    from shardsim.core.tables import Column, Grid, layout, show
    from shardsim.simulator.hardware.topology import builtin_topologies, load_instance

    g = Grid(
        None,
        [Column("topology"), Column("devices"), Column("memory", figure=True), Column("fabric"), Column("NICs")]
        + [Column("price", figure=True)],
    )
    for name in builtin_topologies():
        inst = load_instance(name)
        d, nic = inst.device, inst.nic
        price = f"${inst.price_per_hour_usd:.3f}/h" if inst.price_per_hour_usd else "none"
        fabric = f"{inst.fabric.kind} {inst.fabric.port_GBps:g} GB/s"
        g.add(
            name,
            f"{d.count} x {d.model}",
            f"{d.memory_gib:g} GiB",
            fabric,
            f"{nic.count} x {nic.rate_gbps:g} Gbps",
            price,
        )
    out = console()
    show(out, layout(out, g))
    return 0


def register(sub) -> None:
    t = sub.add_parser(
        "topologies",
        help="list the shipped instance types",
        description="List the shipped instance types: devices, intra-node fabric, NICs, price.",
    )
    t.set_defaults(func=_cmd_topologies)
