"""`shardsim workloads`: the model library, a line each."""

from __future__ import annotations

import argparse


def _params(n: float) -> str:
    """A parameter count as models are named: 334.1 M, 6.649 B."""
    from shardsim.core.units import format_count

    return format_count(n).replace(" G", " B")


def _cmd_workloads(ns: argparse.Namespace) -> int:
    from shardsim.core.console import console
    from shardsim.core.tables import Column, Grid, layout, show
    from shardsim.core.units import format_count
    from shardsim.simulator.workload.families import from_arch
    from shardsim.simulator.workload.library import library

    g = Grid(
        None,
        [
            Column("model"),
            Column("family"),
            Column("params", figure=True),
            Column("layers", figure=True),
            Column("other blocks"),
            Column("FLOP/sample", figure=True),
            Column("published", figure=True),
        ],
    )
    for name, m in library().items():
        w = from_arch(name, m.arch)
        others = ", ".join({"embed": "embedding", "head": "head"}[b.kind] for b in w.blocks if b.kind != "layer")
        published = _params(m.published_params) if m.published_params else ""
        flops = format_count(w.train_flops)
        g.add(name, m.arch.family, _params(w.params), str(len(w.layers)), others, flops, published)
    out = console()
    show(out, layout(out, g))
    return 0


def register(sub) -> None:
    w = sub.add_parser(
        "workloads",
        help="list the model library",
        description="List the model library: family, parameters (and the published count), layers (transformer "
        "or MLP layers; a pipeline stage holds at least one), the other blocks (embedding, head), training FLOPs "
        "per sample. Each model's shape and sources: simulator/workload/library/*.yaml.",
    )
    w.set_defaults(func=_cmd_workloads)
