"""Plots of a sweep (matplotlib Figure objects, PNG rendered by Agg, and SVG): two files per figure.

- breakdown: step time per sharded data-parallel degree (and the best pipeline of each
  degree) as stacked bars of compute, exposed communication, bubble and optimizer, of the
  configurations that fit (those that do not are counted under the panel);
- memory: memory per rank, stacked by kind, against the device's memory (a line with its size);
  a bar far above it is cut at the axis' top with its total written on it;
- throughput_cost: throughput and cost of the leading configurations that fit (those that do
  not are counted in the title);
- scaling (sweeps over several cluster sizes): throughput and scaling efficiency vs node count
  per configuration and cluster, with the ideal (linear) line.
A text model's rates are in tokens (per GPU, and $ per million tokens) as the tables give them,
other models' in samples (`units`). A configuration that does not fit is drawn hatched and
marked ✗, never as a plain bar.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import pandas as pd

# Figures are built with matplotlib.figure.Figure, never pyplot: no display, no global figure
# state, and savefig renders PNG with Agg (and SVG with the svg backend) whatever backend the
# calling process has selected.
from matplotlib.figure import Figure

from shardsim.core.files import atomic_path
from shardsim.sweep.faces import FACES
from shardsim.sweep.ranking import MAX_BARS, PIPELINES, scaling_configs

BREAKDOWN = (
    ("compute_s", "compute", "#4C72B0"),
    ("exposed_comm_s", "exposed comm", "#DD8452"),
    ("bubble_s", "pipeline bubble", "#8C8C8C"),
    ("optimizer_s", "optimizer", "#55A868"),
)
MEMORY = (
    ("mem_params_gib", "params", "#4C72B0"),
    ("mem_grads_gib", "grads", "#DD8452"),
    ("mem_optimizer_gib", "optimizer", "#55A868"),
    ("mem_gathered_gib", "gathered / low-precision copies", "#C44E52"),
    ("mem_activations_gib", "activations", "#8172B3"),
    ("mem_overhead_gib", "runtime overhead", "#937860"),
    ("mem_rest_gib", "step temporaries and allocator reserve", "#CCB974"),  # up to what `fits` compares
)
KIND_COLORS = {k: v.color for k, v in FACES.items()}
CLIP = 2.0  # the memory axis ends at this many times the device's memory when a bar is above it
SCALING_PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


@dataclass(frozen=True)
class Units:
    """The rate and cost a sweep's plots and report give: columns and their names."""

    rate: str
    rate_name: str
    cost: str
    cost_name: str
    tokens: bool


SAMPLES = Units("samples_per_s", "samples/s", "cost_per_million_samples_usd", "USD per million samples", False)
TOKENS = Units(
    "tokens_per_s_per_gpu", "tokens/s per GPU", "cost_per_million_tokens_usd", "USD per million tokens", True
)


def units(df: pd.DataFrame) -> Units:
    """A text model's rows (a sequence length) in tokens per GPU and $ per million tokens, others' in samples."""
    return TOKENS if "seq_len" in df and bool(df["seq_len"].notna().any()) else SAMPLES


def _save(fig: Figure, out: Path, stem: str) -> list[Path]:
    paths = []
    for ext in ("png", "svg"):
        p = out / f"{stem}.{ext}"
        # no date and fixed ids in the SVG: the same sweep gives the same file
        meta = {"Date": None} if ext == "svg" else {}
        with matplotlib.rc_context({"svg.hashsalt": "shardsim"}), atomic_path(p) as tmp:
            fig.savefig(tmp, format=ext, dpi=110, metadata=meta, bbox_inches="tight", pad_inches=0.15)
        paths.append(p)
        fig.set_layout_engine("none")  # laid out by the first save: the second keeps its positions
    return paths


def _clusters(df: pd.DataFrame) -> list[tuple[tuple[str, int], pd.DataFrame]]:
    return [(k, g) for k, g in df.groupby(["topology", "nodes"], sort=False)]


def _cluster_title(top: str, nodes: int, g: pd.DataFrame) -> str:
    return f"{int(nodes)} x {top} ({int(g['world'].iloc[0])} x {g['device'].iloc[0]})"


def short_label(r: pd.Series) -> str:
    return _strategy_label(r) + _tp_of(r) + _settings_of(r["label"])


def _tp_of(r: pd.Series) -> str:
    """ " tp=2 sp": a row's tensor parallelism ("" without)."""
    tp = int(r.get("strategy_tp", 1) or 1)
    if tp == 1:
        return ""
    return f" tp={tp}" + (" sp" if bool(r.get("strategy_sequence_parallel")) else "")


def _strategy_label(r: pd.Series) -> str:
    degree, pp, microbatches = (int(r[f"strategy_{k}"]) for k in ("degree", "pp", "microbatches"))
    return FACES[r["strategy_kind"]].plot_label(degree, pp, microbatches, r["strategy_schedule"])


def _settings_of(config: str) -> str:
    """ " ZeRO-2, ckpt off": what a configuration's label says beyond its strategy's kind and degrees."""
    zero2 = " ZeRO-2" if "(ZeRO-2)" in config else ""
    return zero2 + (", " + config.split(", ", 1)[1] if ", " in config else "")


def representative_rows(g: pd.DataFrame) -> pd.DataFrame:
    """The bars of one cluster: every ddp/zero/zero2d row without tensor parallelism by degree,
    then the best (fitting first, by samples/s) pipeline of each pipeline degree, then the best
    layout of each tensor-parallel degree above 1."""

    def best_of(rows: pd.DataFrame) -> pd.DataFrame:
        return rows.sort_values(["fits", "samples_per_s"], ascending=[False, False], kind="mergesort").iloc[:1]

    tp = g["strategy_tp"] if "strategy_tp" in g else pd.Series(1, index=g.index)
    plain = g[tp == 1]
    dp = plain[~plain["strategy_kind"].isin(PIPELINES)].sort_values("strategy_degree", kind="mergesort")
    best = [best_of(pg) for _, pg in plain[plain["strategy_kind"].isin(PIPELINES)].groupby("strategy_pp", sort=True)]
    best += [best_of(tg) for _, tg in g[tp > 1].groupby(tp[tp > 1], sort=True)]
    return pd.concat([dp, *best]) if best else dp


def _grid(n: int) -> tuple[int, int]:
    cols = min(n, 3)
    return math.ceil(n / cols), cols


def _bars(ax, rows: pd.DataFrame, parts, ylabel: str, limit: float | None = None) -> None:
    """Stacked bars; a configuration that does not fit is hatched and its label ends in ✗ (red).
    With the device's memory (`limit`): its line, labelled with its size, and the axis cut at
    `CLIP` times it when a bar is above that, the bar's total written on it."""
    x = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    fits = rows["fits"].tolist()
    for col, label, color in parts:
        vals = rows[col].astype(float).fillna(0.0).tolist()
        ax.bar(
            x,
            vals,
            bottom=bottom,
            color=color,
            label=label,
            edgecolor="black",
            linewidth=0.4,
            hatch=["" if f else "//" for f in fits],
        )
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    if limit is not None:
        ax.axhline(limit, color="black", linestyle="--", linewidth=1.0, label="device memory")
        ax.annotate(
            f"{limit:,.0f} GiB", (1.0, limit), xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=7
        )
        top = CLIP * limit
        if max(bottom, default=0.0) > top:
            ax.set_ylim(0, top)
            for xi, total in zip(x, bottom, strict=True):
                if total > top:
                    ax.text(
                        xi,
                        top * 0.98,
                        f"{total:,.0f} GiB",
                        rotation=90,
                        ha="center",
                        va="top",
                        fontsize=7,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0},
                    )
    ax.set_xticks(x)
    labels = [short_label(r) + ("" if r["fits"] else " ✗") for _, r in rows.iterrows()]
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    for tick, f in zip(ax.get_xticklabels(), fits, strict=True):
        if not f:
            tick.set_color("#B00000")
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def _legend(fig: Figure, parts, any_unfit: bool, limit: bool = False) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=color, edgecolor="black", linewidth=0.4, label=label) for _, label, color in parts]
    if limit:
        handles.append(Line2D([], [], color="black", linestyle="--", label="device memory"))
    if any_unfit:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="✗ does not fit in memory"))
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8)


def _panels(df: pd.DataFrame):
    """A figure with a panel per cluster (unused ones hidden), and the (cluster, rows, panel) triples."""
    clusters = _clusters(df)
    rows, cols = _grid(len(clusters))
    fig = Figure(figsize=(max(7.0, 5.2 * cols), 4.4 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in list(axes.flat)[len(clusters) :]:
        ax.set_visible(False)
    return fig, [(key, g, ax) for (key, g), ax in zip(clusters, axes.flat, strict=False)]


def plot_breakdown(df: pd.DataFrame, out: Path, stem: str = "breakdown") -> list[Path]:
    return _save(breakdown_figure(df), out, stem)


def breakdown_figure(df: pd.DataFrame) -> Figure:
    """The breakdown of the configurations that fit (`representative_rows`); those that do not
    have no step time and are counted under their panel instead."""
    fig, panels = _panels(df)
    for (top, nodes), g, ax in panels:
        rows = representative_rows(g)
        shown = rows[rows["fits"] & rows["step_time_s"].notna()]
        if shown.empty:
            ax.text(0.5, 0.5, "no configuration fits in memory", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
        else:
            _bars(ax, shown, BREAKDOWN, "step time (s)")
        title = _cluster_title(top, nodes, g)
        if left := int((~rows["fits"]).sum()):
            title += f"\n{left} of these {len(rows)} configurations do not fit in memory: not shown (memory.png)"
        ax.set_title(title, fontsize=9)
    _legend(fig, BREAKDOWN, False)
    job = _one_job(df)
    fig.suptitle(
        f"{df['workload'].iloc[0]}: step time by sharded degree (and the best pipeline per pp, the best layout per "
        f"tensor-parallel degree); {job}",
        fontsize=10,
        wrap=True,
    )
    return fig


def _one_job(df: pd.DataFrame) -> str:
    """What the rows' global batches say of their step times: one job per cluster, or not."""
    if "global_batch" not in df:
        return "global batches not recorded"
    batches = df["global_batch"].dropna().unique()
    if len(batches) == 1:
        return f"every layout at global batch {int(batches[0])}"
    per_cluster = df.groupby(["topology", "nodes"])["global_batch"].nunique(dropna=True)
    if bool((per_cluster <= 1).all()):
        return "every layout of a cluster at that cluster's global batch"
    return "global batches differ between rows: compare rates, not step times"


def plot_memory(df: pd.DataFrame, out: Path, stem: str = "memory") -> list[Path]:
    return _save(memory_figure(df), out, stem)


def memory_figure(df: pd.DataFrame) -> Figure:
    """Each bar the memory a configuration requires (what `fits` compares with the device's):
    its parts, and the rest (the step's temporaries beyond its parts, the allocator's reserve)."""
    parts = [col for col, _, _ in MEMORY[:-1]]
    df = df.assign(mem_rest_gib=(df["memory_required_gib"] - df[parts].sum(axis=1)).clip(lower=0.0))
    fig, panels = _panels(df)
    for (top, nodes), g, ax in panels:
        _bars(ax, representative_rows(g), MEMORY, "memory per rank (GiB)", float(g["device_memory_gib"].iloc[0]))
        ax.set_title(_cluster_title(top, nodes, g), fontsize=9)
    _legend(fig, MEMORY, not df["fits"].all(), limit=True)
    title = f"{df['workload'].iloc[0]}: memory per rank vs device memory"
    if (df["memory_required_gib"] > CLIP * df["device_memory_gib"]).any():
        title += f"\n(a bar above {CLIP:g}x the device's memory is cut at the top, its total written on it)"
    fig.suptitle(title, fontsize=10)
    return fig


def leading_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The throughput plot's bars, best first by the rate it draws (`units`): of the rows that
    fit and were simulated, every ddp/zero/zero2d one, then the leading pipelines, up to `MAX_BARS`."""
    rate = units(df).rate
    ranked = df[df["fits"] & df[rate].notna()].sort_values(rate, ascending=False, kind="mergesort")
    dp = ranked[~ranked["strategy_kind"].isin(PIPELINES)].head(MAX_BARS)
    pipe = ranked[ranked["strategy_kind"].isin(PIPELINES)].head(max(MAX_BARS - len(dp), 0))
    return ranked.loc[ranked.index.isin(dp.index) | ranked.index.isin(pipe.index)]


def plot_throughput_cost(df: pd.DataFrame, out: Path, stem: str = "throughput_cost") -> list[Path]:
    return _save(throughput_cost_figure(df), out, stem)


def throughput_cost_figure(df: pd.DataFrame) -> Figure:
    """Throughput and cost (`units`) of `leading_rows`, one bar each; a row whose topology has
    no price says so in the cost panel. Rows that do not fit (no throughput) are counted in the
    title, not drawn."""
    from matplotlib.patches import Patch

    u = units(df)
    multi = df.groupby(["topology", "nodes"]).ngroups > 1
    top = leading_rows(df).iloc[::-1]  # best at the top of a horizontal bar chart
    labels = [(f"{int(r['nodes'])}x{r['topology']}  " if multi else "") + short_label(r) for _, r in top.iterrows()]
    y = list(range(len(top)))
    fig = Figure(figsize=(12, 0.28 * max(len(top), 3) + 1.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, sharey=True)
    colors = [KIND_COLORS.get(k, "gray") for k in top["strategy_kind"]]
    ax1.barh(y, top[u.rate].astype(float), color=colors, edgecolor="black", linewidth=0.4)
    ax1.set_yticks(y, labels, fontsize=7)
    ax1.set_ylim(-0.6, max(len(top), 1) - 0.4)
    ax1.set_xlabel(u.rate_name)
    ax1.grid(axis="x", alpha=0.3)
    cost = top[u.cost].astype(float)
    if cost.notna().any():
        ax2.barh(y, cost.fillna(0.0), color=colors, edgecolor="black", linewidth=0.4)
        for yi in (yi for yi, v in zip(y, cost, strict=True) if pd.isna(v)):
            ax2.text(0, yi, " unknown (no price)", va="center", fontsize=7)
        ax2.set_xlabel(f"{u.cost_name} (on-demand price)")
    else:
        ax2.text(0.5, 0.5, "cost unknown: the topology has no price", ha="center", va="center", transform=ax2.transAxes)
        ax2.set_xticks([])
    ax2.grid(axis="x", alpha=0.3)
    if top.empty:
        ax1.text(0.5, 0.5, "no configuration fits in memory", ha="center", va="center", transform=ax1.transAxes)
    kinds = [k for k in KIND_COLORS if k in set(top["strategy_kind"])]
    handles = [Patch(color=KIND_COLORS[k], label=k) for k in kinds]
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    title = f"{df['workload'].iloc[0]}: throughput and cost of the leading configurations"
    if unfit := int((~df["fits"]).sum()):
        title += f"\n({unfit} of {len(df)} configurations do not fit in memory: not shown)"
    fig.suptitle(title, fontsize=10)
    return fig


def _scaling_colors(df: pd.DataFrame) -> dict[str, str]:
    """One color a configuration, the same in every cluster's panels."""
    labels = dict.fromkeys(
        c for top in dict.fromkeys(df["topology"]) for c in scaling_configs(df[df["topology"] == top])
    )
    return {c: SCALING_PALETTE[i % len(SCALING_PALETTE)] for i, c in enumerate(labels)}


def _efficiency_floor(values: pd.Series) -> float:
    """The efficiency axis' lower end: a tenth below the lowest value, rounded down to a tenth (0 at least)."""
    low = values.min() if values.notna().any() else 1.0
    return max(0.0, math.floor((low - 0.05) * 10) / 10)


def plot_scaling(df: pd.DataFrame, out: Path, stem: str = "scaling") -> list[Path]:
    return _save(scaling_figure(df), out, stem)


def scaling_figure(df: pd.DataFrame) -> Figure:
    """Per cluster (a column each), throughput (a text model's in tokens/s over all its GPUs,
    others' in samples/s) and scaling efficiency vs node count, a line per
    configuration present at two or more sizes (`scaling_configs`), on linear axes with a tick at
    each node count. Only what is drawn is in the legend (below the panels, off the data); a size
    where a configuration does not fit is an x on the zero line; a configuration that fits at no
    size is named under its cluster's title instead of drawn."""
    from matplotlib.lines import Line2D

    tops = list(dict.fromkeys(df["topology"]))
    fig = Figure(figsize=(5.2 * len(tops) + 0.8, 8.2), layout="constrained")
    axes = fig.subplots(2, len(tops), squeeze=False)
    mode = df["scaling_mode"].iloc[0] if "scaling_mode" in df else "weak"
    colors = _scaling_colors(df)
    per_sample = df["seq_len"].astype(float) if units(df).tokens else pd.Series(1.0, index=df.index)
    df = df.assign(rate=df["samples_per_s"] * per_sample, ideal_rate=df["ideal_samples_per_s"] * per_sample)
    drawn: dict[str, str] = {}
    ideal_drawn = unfit_drawn = False
    for j, top in enumerate(tops):
        g = df[df["topology"] == top]
        ax, ax_eff = axes[0, j], axes[1, j]
        never: list[str] = []
        for cfg in scaling_configs(g):
            s = g[g["label"] == cfg].sort_values("nodes", kind="mergesort")
            ok = s[s["fits"] & s["rate"].notna()]
            if ok.empty:
                never.append(cfg)
                continue
            color = drawn.setdefault(cfg, colors[cfg])
            ax.plot(ok["nodes"], ok["rate"], "o-", color=color, linewidth=1.4, markersize=4)
            ideal = ok[ok["ideal_rate"].notna()]
            if len(ideal) > 1:
                ax.plot(ideal["nodes"], ideal["ideal_rate"], ":", color=color, linewidth=1.0, alpha=0.8)
                ideal_drawn = True
            bad = s[~s["fits"]]
            if not bad.empty:
                ax.plot(bad["nodes"], [0.0] * len(bad), "x", color=color, markersize=7, clip_on=False)
                unfit_drawn = True
            eff = s[s["scaling_efficiency"].notna()]
            ax_eff.plot(eff["nodes"], eff["scaling_efficiency"], "o-", color=color, linewidth=1.4, markersize=4)
        nodes = sorted(int(n) for n in g["nodes"].unique())
        per_node = int(g["world"].iloc[0]) // int(g["nodes"].iloc[0])
        for a in (ax, ax_eff):
            a.set_xticks(nodes, [str(n) for n in nodes])
            span = nodes[-1] - nodes[0] or 1
            a.set_xlim(nodes[0] - 0.04 * span, nodes[-1] + 0.04 * span)
            a.set_xlabel(f"nodes ({per_node} GPUs each)")
            a.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("tokens/s (all GPUs)" if units(df).tokens else "samples/s")
        ax.yaxis.set_major_formatter("{x:,.0f}")
        title = f"{top} ({g['workload'].iloc[0]}, {g['precision'].iloc[0]})"
        if never:
            title += "\n" + textwrap.fill("does not fit at any size: " + ", ".join(never), 64)
        ax.set_title(title, fontsize=9)
        ax_eff.set_ylabel(f"{mode} scaling efficiency")
        ax_eff.set_ylim(_efficiency_floor(g["scaling_efficiency"]), 1.02)
    handles = [Line2D([], [], color=c, marker="o", markersize=4, label=cfg) for cfg, c in drawn.items()]
    if ideal_drawn:
        handles.append(
            Line2D([], [], color="black", linestyle=":", label="ideal: linear from the line's smallest size")
        )
    if unfit_drawn:
        handles.append(Line2D([], [], color="black", marker="x", linestyle="none", label="does not fit in memory"))
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), fontsize=8)
    rate = "tokens/s" if units(df).tokens else "samples/s"
    fig.suptitle(f"{mode} scaling: {rate} and scaling efficiency vs nodes, per configuration", fontsize=10)
    return fig


def plot_all(df: pd.DataFrame, out: str | Path) -> list[Path]:
    """Every plot that applies to this sweep; returns the files written."""
    out = Path(out)
    paths = plot_breakdown(df, out) + plot_memory(df, out) + plot_throughput_cost(df, out)
    if "scaling_efficiency" in df and df.groupby("topology")["world"].nunique().max() > 1:
        paths += plot_scaling(df, out)
    return paths
