"""`shardsim topologies`: the shipped instance types, a row each; `topologies NAME` shows one, and
``--yaml`` / ``--json`` export it as a topology file (every figure with its source) to edit and
pass back as ``--topology FILE``."""

from __future__ import annotations

import argparse
import json


def _list() -> int:
    from shardsim.core.console import console
    from shardsim.core.tables import Column, Grid, layout, show
    from shardsim.specs.hardware.topology import builtin_topologies, load_instance

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


def _show(name: str, fmt: str | None) -> int:
    """One topology: as labelled lines, or its file's document as YAML or JSON."""
    from shardsim.core.console import labelled, output_width
    from shardsim.specs.hardware.topology import load_instance, topology_document

    inst = load_instance(name)  # an unknown name: one line naming the nearest
    if fmt:
        doc = topology_document(name)
        if fmt == "json":
            print(json.dumps(doc, indent=2))
        else:
            import yaml

            print(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=10_000), end="")
        return 0
    d, f, nic, h, width = inst.device, inst.fabric, inst.nic, inst.host, output_width()
    price = f"${inst.price_per_hour_usd:.3f} per node-hour" if inst.price_per_hour_usd else "none given"
    peaks = ", ".join(f"{p} {v:g} TFLOP/s" for p, v in d.peak_tflops.items())
    fabric = f"{f.kind} {f.port_GBps:g} GB/s per device and direction, latency {f.latency_us:g} us"
    rdma = ", GPUDirect RDMA" if nic.gpudirect_rdma else ""
    lines = [
        ("devices", f"{d.count} x {d.model}, {d.memory_gib:g} GiB, {d.memory_bandwidth_GBps:g} GB/s memory"),
        ("peak", peaks),
        ("fabric", fabric + (f", {f.generation}" if f.generation else "") + (", NVLS" if f.nvls else "")),
        ("NICs", f"{nic.count} x {nic.rate_gbps:g} Gbps {nic.fabric}{rdma}, latency {nic.latency_us:g} us"),
        ("host", f"{h.cores} cores, {h.memory_gib:g} GiB"),
        ("price", price),
        ("file", f"{inst.path} (--yaml: every figure with its source)"),
    ]
    print(f"{inst.name}: {inst.description}")
    for label, text in lines:
        print(labelled(label, text, width))
    return 0


def _cmd_topologies(ns: argparse.Namespace) -> int:
    fmt = "json" if ns.json else "yaml" if ns.yaml else None
    if ns.name is None:
        if fmt:
            from shardsim.core.errors import ConfigError

            raise ConfigError(f"--{fmt} exports one topology: name it (shardsim topologies NAME --{fmt})")
        return _list()
    return _show(ns.name, fmt)


def register(sub) -> None:
    t = sub.add_parser(
        "topologies",
        help="list the shipped instance types, or show or export one",
        description="List the shipped instance types: devices, intra-node fabric, NICs, price. With a NAME, show "
        "that one; with --yaml or --json, print it as a topology file (every figure with its source) to edit and "
        "pass back as --topology FILE.",
    )
    t.add_argument("name", nargs="?", metavar="NAME", help="a shipped instance type (or a topology file's path)")
    fmt = t.add_mutually_exclusive_group()
    fmt.add_argument("--yaml", action="store_true", help="print NAME as a topology YAML file")
    fmt.add_argument("--json", action="store_true", help="print NAME as JSON (the same document)")
    t.set_defaults(func=_cmd_topologies)
