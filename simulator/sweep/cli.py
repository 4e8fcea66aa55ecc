"""`shardsim sweep`: every valid configuration of a scenario, predicted, ranked, recommended.

shardsim sweep                                   # the seed scenario, all strategies
shardsim sweep --strategies ddp,zero2d --degrees 4,8
shardsim sweep --workload gpt-10b --topology p4d.24xlarge --nodes 4,8,16 --precision bf16 --out results/
shardsim sweep --global-batch 512 --nodes 2,4,8   # strong scaling
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shardsim.simulator.config import SCHEDULES, STRATEGIES, load_config
from shardsim.simulator.config.flags import (
    add_algo_argument,
    add_config_arguments,
    choice_list,
    int_list,
    overrides_from_args,
)

SPANNED = ("strategy", "degree", "pp", "microbatches", "schedule")  # the sweep spans these with lists of its own


def _build(ns: argparse.Namespace):
    from shardsim.simulator.sweep.space import SweepSpace

    overrides: dict[str, Any] = {k: v for k, v in overrides_from_args(ns).items() if k not in SPANNED}
    overrides["topology"] = ns.topology[0] if ns.topology else None  # the first cluster is the base
    overrides["nodes"] = ns.nodes[0] if ns.nodes else None
    base = load_config(ns.config, overrides)
    space = SweepSpace(
        strategies=ns.strategies or STRATEGIES,
        degrees=ns.degrees,
        pp=ns.pp,
        microbatches=ns.microbatches,
        schedules=ns.schedules or SCHEDULES,
        topologies=ns.topology,
        nodes=ns.nodes,
        global_batch=ns.global_batch,
    )
    return base, space


def _progress_bar(enabled: bool):
    """A rich progress bar on stderr, or None."""
    if not enabled:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("predicting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def _cmd_sweep(ns: argparse.Namespace) -> int:
    from shardsim.simulator.sweep.output import check_output_dir, to_records, write_recommendation, write_tables
    from shardsim.simulator.sweep.recommendation import recommend
    from shardsim.simulator.sweep.report import print_report
    from shardsim.simulator.sweep.search import sweep

    base, space = _build(ns)
    out = check_output_dir(ns.out) if ns.out else None
    show_progress = not ns.json and not ns.no_progress and sys.stderr.isatty()
    bar = _progress_bar(show_progress)
    skipped: list[str] = []
    if bar is None:
        df = sweep(base, space, algo=ns.algo, workers=ns.workers, skipped=skipped)
    else:
        task = bar.add_task("predict", total=None)

        def progress(done: int, total: int) -> None:
            # started at the first result, after the worker processes exist: never fork with
            # the bar's refresh thread running
            if not bar.live.is_started:
                bar.start()
            bar.update(task, completed=done, total=total)

        try:
            df = sweep(base, space, algo=ns.algo, workers=ns.workers, skipped=skipped, progress=progress)
        finally:
            bar.stop()
    rec = recommend(df)
    files: list[str] = []
    if out is not None:
        from shardsim.simulator.sweep.plots import plot_all

        files += [str(p) for p in write_tables(df, out)]
        files.append(str(write_recommendation(rec, out)))
        if not ns.no_plots:
            files += [str(p) for p in plot_all(df, out)]
    if ns.json:
        print(json.dumps({"rows": to_records(df), "recommended": rec, "skipped": skipped, "files": files}))
        return 0
    print_report(df, rec, base, global_batch=ns.global_batch, top=ns.top, skipped=skipped, files=files, out_dir=ns.out)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="predict every valid configuration and recommend one (default: the seed scenario)",
        description="Enumerate ddp, zero, zero2d at every degree, pipelines (x sharding) at every valid degree, "
        "microbatch count and schedule; predict each; rank; recommend. Lists are comma-separated.",
    )
    add_config_arguments(
        p,
        exclude=SPANNED,
        listed=("topology", "nodes"),
        config_help="YAML config file: workload, topology, nodes, batch... (flags override)",
    )
    p.add_argument(
        "--strategies",
        "--strategy",
        dest="strategies",
        type=choice_list(STRATEGIES),
        help=f"kinds to include (default all: {','.join(STRATEGIES)})",
    )
    p.add_argument(
        "--degrees",
        "--degree",
        dest="degrees",
        type=int_list,
        help="shard degrees for zero2d and for pipeline stages, 1 = unsharded stages (default: every divisor); "
        "ddp (1) and zero (world) are kept when selected",
    )
    p.add_argument("--pp", type=int_list, help="pipeline degrees (default: every divisor of the world, 2..layers)")
    p.add_argument(
        "--microbatches",
        type=int_list,
        help="microbatch counts (default: pp, 2pp, 4pp where they divide the per-replica batch)",
    )
    p.add_argument(
        "--schedules",
        "--schedule",
        dest="schedules",
        type=choice_list(SCHEDULES),
        help="pipeline schedules (default gpipe,1f1b)",
    )
    p.add_argument(
        "--global-batch",
        type=int,
        dest="global_batch",
        help="strong scaling: fixed global batch, batch per device = N / (world x grad_accum)",
    )
    add_algo_argument(p, auto=True)
    p.add_argument("--out", metavar="DIR", help="write sweep.csv, sweep.parquet, recommended.json and plots here")
    p.add_argument("--no-plots", action="store_true", help="with --out: tables only")
    p.add_argument("--json", action="store_true", help='print {"rows": [...], "recommended": {...}}')
    p.add_argument("--top", type=int, default=25, help="rows shown in the table (0: all; default 25)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: the machine's cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_sweep)
