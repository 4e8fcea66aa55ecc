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
from collections.abc import Callable
from typing import Any

from shardsim.simulator.config import BACKENDS, PRECISIONS, SCHEDULES, STRATEGIES, load_config
from shardsim.simulator.units import format_seconds


def _int_list(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return tuple(dict.fromkeys(vals))


def _choice_list(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        vals = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [v for v in vals if v not in choices]
        if not vals or bad:
            raise argparse.ArgumentTypeError(f"expected some of {','.join(choices)}, got {text!r}")
        return tuple(dict.fromkeys(vals))

    return parse


def _str_list(text: str) -> tuple[str, ...]:
    vals = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not vals:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return vals


def _build(ns: argparse.Namespace):
    from shardsim.simulator.sweep.search import SweepSpace

    overrides: dict[str, Any] = {
        "workload": ns.workload,
        "topology": ns.topology[0] if ns.topology else None,
        "nodes": ns.nodes[0] if ns.nodes else None,
        "batch_per_device": ns.batch_per_device,
        "grad_accum": ns.grad_accum,
        "precision": ns.precision,
        "checkpointing": ns.checkpointing,
        "backend": ns.backend,
        "profile": ns.profile,
        "seed": ns.seed,
    }
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


def _fmt_cost(v) -> str:
    import pandas as pd

    return "unknown" if v is None or pd.isna(v) else f"${v:,.2f}"


def _mem_cell(r) -> str:
    if r["fits"]:
        return f"{r['memory_per_rank_gib']:.2f}"
    return f"[red]{r['memory_per_rank_gib']:.2f} > {r['device_memory_gib']:g} ✗[/red]"


def _ranked_table(df, title: str, top: int, with_cluster: bool = False, wide: bool = True):
    """The ranked rows; `wide` False (a narrow terminal) leaves out the breakdown columns."""
    from rich.table import Table

    t = Table(title=title, title_justify="left", header_style="bold")
    t.add_column("#", justify="right")
    if with_cluster:
        t.add_column("cluster", no_wrap=True)
    t.add_column("configuration", no_wrap=True)
    t.add_column("step", justify="right", no_wrap=True)
    t.add_column("samples/s", justify="right")
    if wide:
        t.add_column("compute", justify="right")
        t.add_column("exp. comm", justify="right")
        t.add_column("bubble", justify="right")
        t.add_column("optim.", justify="right")
    t.add_column("mem/rank GiB", justify="right", no_wrap=True)
    t.add_column("$/M samples", justify="right")
    shown = df if top <= 0 else df.head(top)
    for i, (_, r) in enumerate(shown.iterrows(), start=1):
        cells = [str(int(r["rank"])) if not with_cluster else str(i)]
        if with_cluster:
            cells.append(f"{int(r['nodes'])} x {r['topology']}")
        cells += [r["config"], format_seconds(r["step_time_s"]), f"{r['samples_per_s']:.1f}"]
        if wide:
            cells += [f"{r[k]:.3f}" for k in ("compute_s", "exposed_comm_s", "bubble_s", "optimizer_s")]
        cells += [_mem_cell(r), _fmt_cost(r["cost_per_million_samples_usd"])]
        t.add_row(*cells, style=None if r["fits"] else "dim")
    return t, len(df) - len(shown)


def _describe(s: dict | None) -> str:
    if s is None:
        return "-"
    return f"{s['config']} ({format_seconds(s['step_time_s'])}/step, {s['samples_per_s']:.1f} samples/s)"


def _recommendation_lines(rec: dict, multi: bool) -> list[str]:
    if rec["best"] is None:
        return [f"[bold red]No recommendation:[/bold red] {rec['reason']}"]
    where = ""
    if multi:
        b = rec["best"]
        where = f" on {b['nodes']} x {b['topology']}"
    lines = []
    sdp = rec["sdp"]
    if sdp is not None:
        sdp_where = f" on {sdp['nodes']} x {sdp['topology']}" if multi else ""
        line = (
            f"[bold]Recommended sharded_data_parallel_degree: {rec['sharded_data_parallel_degree']}[/bold]"
            f" = {_describe(sdp)}{sdp_where}"
        )
        if rec["sdp_runner_up"] is not None:
            line += f"; {rec['sdp_margin'] * 100:.1f}% faster than {rec['sdp_runner_up']['config']}"
            if rec["sdp_runner_up"]["nodes"] != sdp["nodes"] and multi:
                line += f" on {rec['sdp_runner_up']['nodes']} x {rec['sdp_runner_up']['topology']}"
        lines.append(line)
    else:
        lines.append("No ddp/zero/zero2d configuration fits in memory; only pipelines do.")
    line = f"[bold]Best configuration overall:[/bold] {_describe(rec['best'])}{where}"
    if rec["runner_up"] is not None:
        ru = rec["runner_up"]
        ru_where = f" on {ru['nodes']} x {ru['topology']}" if multi else ""
        if rec["margin"] < 0.001:
            line += f"; tied (within 0.1%) with the runner-up, {ru['config']}{ru_where}"
        else:
            line += f"; {rec['margin'] * 100:.1f}% faster than the runner-up, {ru['config']}{ru_where}"
    else:
        line += "; it is the only configuration that fits"
    lines.append(line)
    if rec["best"]["strategy"] == "pipeline" and rec.get("margin_over_sdp") is not None:
        lines.append(
            f"The best pipeline is {rec['margin_over_sdp'] * 100:.1f}% faster than the best sharded data parallel "
            f"configuration ({rec['sdp']['config']})."
        )
    if multi and rec.get("cheapest"):
        c = rec["cheapest"]
        lines.append(
            f"[bold]Cheapest per sample:[/bold] {c['config']} on {c['nodes']} x {c['topology']}, "
            f"{_fmt_cost(c['cost_per_million_samples_usd'])} per million samples"
        )
    return lines


def _cluster_table(df, rec):
    from rich.table import Table

    t = Table(title="Per cluster", title_justify="left", header_style="bold")
    for col, just in (
        ("cluster", "left"),
        ("GPUs", "right"),
        ("best configuration", "left"),
        ("step", "right"),
        ("samples/s", "right"),
        ("efficiency", "right"),
        ("$/M samples", "right"),
        ("sdp degree", "right"),
    ):
        t.add_column(col, justify=just)
    for c in rec["clusters"]:
        b = c["best"]
        if b is None:
            t.add_row(f"{c['nodes']} x {c['topology']}", str(c["world"]), "[red]nothing fits[/red]", "", "", "", "", "")
            continue
        row = df[(df["topology"] == c["topology"]) & (df["nodes"] == c["nodes"]) & (df["config"] == b["config"])]
        eff = row["scaling_efficiency"].iloc[0] if "scaling_efficiency" in row and len(row) else float("nan")
        t.add_row(
            f"{c['nodes']} x {c['topology']}",
            str(c["world"]),
            b["config"],
            format_seconds(b["step_time_s"]),
            f"{b['samples_per_s']:.1f}",
            "-" if eff != eff else f"{eff * 100:.0f}%",
            _fmt_cost(b["cost_per_million_samples_usd"]),
            "-" if c["sharded_data_parallel_degree"] is None else str(c["sharded_data_parallel_degree"]),
        )
    return t


def _efficiency_table(df):
    """Scaling efficiency of the ddp/zero/zero2d configurations (and the best pipelines), per GPU count."""
    from rich.table import Table
    from shardsim.simulator.sweep.plots import scaling_configs

    tables = []
    for top, g in df.groupby("topology", sort=False):
        worlds = sorted(g["world"].unique())
        if len(worlds) < 2:
            continue
        mode = g["scaling_mode"].iloc[0]
        t = Table(
            title=f"{mode.capitalize()} scaling efficiency on {top} (vs {int(worlds[0])} GPUs; ✗ = does not fit)",
            title_justify="left",
            header_style="bold",
        )
        t.add_column("configuration")
        for w in worlds:
            t.add_column(f"{int(w)}", justify="right")
        for cfg in scaling_configs(g):
            cells = []
            for w in worlds:
                r = g[(g["config"] == cfg) & (g["world"] == w)]
                if r.empty:
                    cells.append("")
                else:
                    r = r.iloc[0]
                    cells.append(f"{r['scaling_efficiency'] * 100:.0f}%" + ("" if r["fits"] else " ✗"))
            t.add_row(cfg, *cells)
        tables.append(t)
    return tables


def _cmd_sweep(ns: argparse.Namespace) -> int:
    from shardsim.simulator.sweep.search import check_output_dir, recommend, sweep, to_records, write_tables

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
        (out / "recommended.json").write_text(json.dumps(rec, indent=2) + "\n")
        files.append(str(out / "recommended.json"))
        if not ns.no_plots:
            files += [str(p) for p in plot_all(df, out)]
    if ns.json:
        print(json.dumps({"rows": to_records(df), "recommended": rec, "skipped": skipped, "files": files}))
        return 0
    _print_report(df, rec, base, ns, skipped, files)
    return 0


def _print_report(df, rec, base, ns, skipped: list[str], files: list[str]) -> None:
    from rich.console import Console

    out = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
    clusters = list(df.groupby(["topology", "nodes"], sort=False))
    multi = len(clusters) > 1
    head = (
        f"{base.workload}, batch {base.batch_per_device}/device"
        if ns.global_batch is None
        else f"{base.workload}, global batch {ns.global_batch} (strong scaling)"
    )
    head += f", {base.precision}, checkpointing {'on' if base.checkpointing else 'off'}, {base.backend}"
    if multi:
        out.print(f"Sweep of {len(df)} configurations over {len(clusters)} clusters: {head}")
        out.print(_cluster_table(df, rec))
        for t in _efficiency_table(df):
            out.print(t)
        ranked = df.sort_values(["fits", "samples_per_s"], ascending=[False, False], kind="mergesort")
        table, more = _ranked_table(
            ranked, "Leading configurations (all clusters, by samples/s)", ns.top, True, out.width >= 140
        )
        out.print(table)
    else:
        (top, nodes), g = clusters[0]
        title = f"{int(nodes)} x {top} ({int(g['world'].iloc[0])} x {g['device'].iloc[0]}): {head}"
        table, more = _ranked_table(g, title, ns.top, wide=out.width >= 120)
        out.print(table)
    if more:
        out.print(f"… {more} more rows" + (" in the CSV" if files else " (--top 0 shows all, --out DIR saves them)"))
    unfit = df[~df["fits"]]
    if len(unfit):
        line = f"{len(unfit)} of {len(df)} configurations do not fit in memory (marked ✗; never recommended)"
        if more:  # some of them may be below the table's cut: name the leading ones
            names = [
                f"{r['config']}"
                + (f" on {int(r['nodes'])} x {r['topology']}" if multi else "")
                + f" ({r['memory_per_rank_gib']:.2f} GiB)"
                for _, r in unfit.sort_values("samples_per_s", ascending=False, kind="mergesort").head(3).iterrows()
            ]
            line += ": " + ", ".join(names) + (", …" if len(unfit) > 3 else ".")
        else:
            line += "."
        out.print(line)
    for line in skipped:
        out.print(f"[yellow]skipped[/yellow] {line}")
    for line in _recommendation_lines(rec, multi):
        out.print(line)
    if files:
        out.print(f"Wrote {len(files)} files to {ns.out}: " + ", ".join(sorted({f.rsplit("/", 1)[-1] for f in files})))


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="predict every valid configuration and recommend one (default: the seed scenario)",
        description="Enumerate ddp, zero, zero2d at every degree, pipelines (x sharding) at every valid degree, "
        "microbatch count and schedule; predict each; rank; recommend. Lists are comma-separated.",
    )
    p.add_argument("config", nargs="?", help="YAML config file: workload, topology, nodes, batch... (flags override)")
    p.add_argument("--workload", help="preset name or pkg.module:build_fn")
    p.add_argument(
        "--topology", type=_str_list, help="instance type(s) or YAML path(s), e.g. p4d.24xlarge,p3dn.24xlarge"
    )
    p.add_argument("--nodes", type=_int_list, help="node count(s), e.g. 2,4,8,16")
    p.add_argument(
        "--strategies",
        "--strategy",
        dest="strategies",
        type=_choice_list(STRATEGIES),
        help=f"kinds to include (default all: {','.join(STRATEGIES)})",
    )
    p.add_argument(
        "--degrees",
        "--degree",
        dest="degrees",
        type=_int_list,
        help="shard degrees for zero2d and for pipeline stages, 1 = unsharded stages (default: every divisor); "
        "ddp (1) and zero (world) are kept when selected",
    )
    p.add_argument("--pp", type=_int_list, help="pipeline degrees (default: every divisor of the world, 2..layers)")
    p.add_argument(
        "--microbatches",
        type=_int_list,
        help="microbatch counts (default: pp, 2pp, 4pp where they divide the per-replica batch)",
    )
    p.add_argument(
        "--schedules",
        "--schedule",
        dest="schedules",
        type=_choice_list(SCHEDULES),
        help="pipeline schedules (default gpipe,1f1b)",
    )
    p.add_argument("--batch-per-device", type=int, dest="batch_per_device")
    p.add_argument(
        "--global-batch",
        type=int,
        dest="global_batch",
        help="strong scaling: fixed global batch, batch per device = N / (world x grad_accum)",
    )
    p.add_argument("--grad-accum", type=int, dest="grad_accum")
    p.add_argument("--precision", choices=PRECISIONS)
    p.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--backend", choices=BACKENDS)
    p.add_argument("--profile", help="measured profile file (shardsim profile)")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--algo",
        default="auto",
        choices=("auto", "ring", "tree", "hierarchical"),
        help="collective algorithm (as for predict)",
    )
    p.add_argument("--out", metavar="DIR", help="write sweep.csv, sweep.parquet, recommended.json and plots here")
    p.add_argument("--no-plots", action="store_true", help="with --out: tables only")
    p.add_argument("--json", action="store_true", help='print {"rows": [...], "recommended": {...}}')
    p.add_argument("--top", type=int, default=25, help="rows shown in the table (0: all; default 25)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: the machine's cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_sweep)
