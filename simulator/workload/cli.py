"""`shardsim workloads`: the model library, a line each."""

from __future__ import annotations

import argparse


def _cmd_workloads(ns: argparse.Namespace) -> int:
    from shardsim.simulator.workload.families import from_arch
    from shardsim.simulator.workload.library import library

    for name, m in library().items():
        w = from_arch(name, m.arch)
        published = f"  (published {m.published_params / 1e6:.1f} M)" if m.published_params else ""
        print(
            f"{name:15s} {m.arch.family:6s} {w.params / 1e6:12.1f} M params  {len(w.blocks):4d} blocks  "
            f"{w.train_flops / 1e9:14.2f} GFLOP/sample{published}"
        )
    return 0


def register(sub) -> None:
    w = sub.add_parser(
        "workloads",
        help="list the model library",
        description="List the model library: family, parameters (and the published count), blocks, "
        "training FLOPs per sample. Each model's shape and sources: simulator/workload/library/*.yaml.",
    )
    w.set_defaults(func=_cmd_workloads)
