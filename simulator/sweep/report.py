"""A sweep on the terminal: the ranked tables and the recommendation, as rich renders them."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from shardsim.simulator.config import CHECKPOINTING, OPTIMIZER_IMPLS, PRECISIONS, RunConfig
from shardsim.simulator.units import format_seconds
from shardsim.simulator.workload.load import spec_name

if TYPE_CHECKING:
    import pandas as pd


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


def _settings_listed(df) -> str:
    """ "ZeRO-3/ZeRO-2; checkpointing off/selective op; ...": the values of each setting in the
    rows, where the sweep listed settings ("" where it did not)."""
    if "checkpointing" not in df:
        return ""
    parts = []
    raf = sorted(df["reshard_after_forward"].dropna().unique(), reverse=True)
    if len(raf) > 1:
        parts.append("/".join("ZeRO-3" if v else "ZeRO-2" for v in raf))
    pairs = sorted(
        set(zip(df["checkpointing"], df["selective_ac_option"].fillna(""), strict=True)),
        key=lambda p: (CHECKPOINTING.index(p[0]), p[1]),
    )
    ckpt = [RunConfig(checkpointing=c, selective_ac_option=o).checkpointing_label() for c, o in pairs]
    for name, values in (
        ("checkpointing", ckpt),
        ("reduce", sorted(df["reduce_dtype"].unique(), key=PRECISIONS.index)),
        ("adam", sorted(df["optimizer_impl"].unique(), key=OPTIMIZER_IMPLS.index)),
    ):
        if len(values) > 1:
            parts.append(f"{name} " + "/".join(values))
    return "; ".join(parts)


def print_report(
    df: pd.DataFrame,
    rec: dict[str, Any],
    base: RunConfig,
    *,
    global_batch: int | None,
    top: int,
    skipped: list[str],
    files: list[str],
    out_dir: str | None,
) -> None:
    """The sweep on the terminal: the ranked table (per cluster and scaling efficiency when the
    sweep spans several), what does not fit, what was skipped, the recommendation and the files
    written. Rich markup; 160 columns wide when stdout is not a terminal."""
    from rich.console import Console

    out = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
    clusters = list(df.groupby(["topology", "nodes"], sort=False))
    multi = len(clusters) > 1
    head = (
        f"{spec_name(base.workload)}, batch {base.batch_per_device}/device"
        if global_batch is None
        else f"{spec_name(base.workload)}, global batch {global_batch} (strong scaling)"
    )
    head += f", {base.precision}, checkpointing {base.checkpointing_label()}"
    if base.reduce_dtype is not None:
        head += f", reduce {base.grad_dtype}"
    if base.optimizer_impl != RunConfig.optimizer_impl:
        head += f", {base.optimizer} {base.optimizer_impl}"
    head += f", {base.backend}"
    listed = _settings_listed(df)
    if listed:
        out.print(f"Settings listed (a configuration names those that differ from the base's): {listed}")
    if multi:
        out.print(f"Sweep of {len(df)} configurations over {len(clusters)} clusters: {head}")
        out.print(_cluster_table(df, rec))
        for t in _efficiency_table(df):
            out.print(t)
        ranked = df.sort_values(["fits", "samples_per_s"], ascending=[False, False], kind="mergesort")
        table, more = _ranked_table(
            ranked, "Leading configurations (all clusters, by samples/s)", top, True, out.width >= 140
        )
        out.print(table)
    else:
        (topology, nodes), g = clusters[0]
        title = f"{int(nodes)} x {topology} ({int(g['world'].iloc[0])} x {g['device'].iloc[0]}): {head}"
        table, more = _ranked_table(g, title, top, wide=out.width >= 120)
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
        out.print(f"Wrote {len(files)} files to {out_dir}: " + ", ".join(sorted({f.rsplit("/", 1)[-1] for f in files})))
