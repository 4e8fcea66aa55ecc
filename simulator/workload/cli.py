"""`shardsim workloads`: the workload presets, a line each."""

from __future__ import annotations

import argparse


def _cmd_workloads(ns: argparse.Namespace) -> int:
    from shardsim.simulator.workload.model import PRESETS, load_workload

    for name in PRESETS:
        w = load_workload(name)
        print(
            f"{name:12s} {w.params / 1e6:10.1f} M params  {len(w.blocks):3d} blocks  "
            f"{w.train_flops / 1e9:12.2f} GFLOP/sample"
        )
    return 0


def register(sub) -> None:
    w = sub.add_parser(
        "workloads",
        help="list the workload presets",
        description="List the workload presets: parameters, blocks, training FLOPs per sample.",
    )
    w.set_defaults(func=_cmd_workloads)
