"""A sweep on the terminal: the ranked tables and the recommendation, as rich renders them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.config import CHECKPOINTING, DATA_PARALLEL, OPTIMIZER_IMPLS, PRECISIONS, SAC_OP, RunConfig
from shardsim.config.model_defaults import library_text
from shardsim.core.console import console
from shardsim.core.tables import Column, Grid, fitted, layout, show
from shardsim.core.units import (
    GIB,
    format_bytes,
    format_percent,
    format_rate,
    format_rate_unit,
    format_seconds,
    format_usd,
)
from shardsim.simulator.economics import MODEL_ERROR
from shardsim.specs.model.load import display_name
from shardsim.specs.strategies import STRATEGIES as KINDS

if TYPE_CHECKING:
    import pandas as pd


def _fmt_cost(v) -> str:
    return format_usd(None if v is None else float(v))


def _tokens(df) -> bool:
    """Whether the table's rows are of a text model (a sequence length: rates in tokens)."""
    return "seq_len" in df and bool(df["seq_len"].notna().any())


def _mem_cell(r) -> str:
    size = format_bytes(r["memory_required_gib"] * GIB)
    if r["fits"]:
        return size
    return f"[red]{size} > {format_bytes(r['device_memory_gib'] * GIB)} ✗[/red]"


BREAKDOWN = {"compute_s": "compute", "exposed_comm_s": "exp. comm", "bubble_s": "bubble", "optimizer_s": "optim."}
LEFT_OUT = "the breakdown columns (compute, exposed comm, bubble, optimizer)"


def micro_batch(r) -> float:
    """The samples one micro-batch of a row's replica holds: a pipeline's batch per replica (batch per
    device × stages) over its microbatches, else the batch per device (a tensor-parallel group's)."""
    if int(r["strategy_pp"]) > 1:
        return int(r["batch_per_device"]) * int(r["strategy_pp"]) / int(r["strategy_microbatches"])
    return int(r["batch_per_device"])


def mixed_batches_line(df) -> str | None:
    """One line where a cluster's rows run different global batches (batch axes the sweep was
    given, a batch search without --global-batch): their ranking by throughput is then not by
    step time, and rows do not run the same job."""
    sizes = df.groupby(["topology", "nodes"], sort=False)["global_batch"].nunique()
    if not bool((sizes > 1).any()):
        return None
    values = ", ".join(str(int(v)) for v in sorted(df["global_batch"].unique()))
    return (
        f"These rows run different global batches ({values}), as the batch axes asked: ranked by throughput, "
        "not by step time (--global-batch N holds one for every row)."
    )


def _ranked_grid(
    df,
    title: str,
    top: int,
    with_cluster: bool = False,
    breakdown: bool = True,
    mfu: bool = True,
    batches: int = 2,
) -> tuple[Grid, int]:
    """The ranked rows (and how many were left below `top`); `breakdown` False leaves out the four
    columns of where the step goes, `mfu` False the MFU column; `batches` 2 shows each row's
    global batch and micro-batch, 1 the micro-batch alone (where the header names the global
    batch every row runs), 0 neither."""
    cols = [Column("#", figure=True), *([Column("cluster")] if with_cluster else []), Column("configuration")]
    # the layout, tp×pp×dp(shard), where a row has tensor, pipeline or context parallelism (else its label says it all)
    cp = df["strategy_cp"] > 1 if "strategy_cp" in df else False
    layouts = bool(((df["strategy_tp"] > 1) | (df["strategy_pp"] > 1) | cp).any())
    if layouts:
        cols.append(Column("layout"))
    # each row's global batch and the micro-batch a replica runs (× its accumulation steps where any accumulates)
    accumulates = bool((df["grad_accum"] > 1).any())
    micro_name = "micro×ga" if accumulates else "micro"
    cols += [Column(name, figure=True) for name in ("global", micro_name)[2 - batches :]]
    # a text model's rows in tokens (its tokens/s per GPU and $ per million tokens), others' in samples
    tokens = _tokens(df)
    rate_name, cost_name = ("tok/s/GPU", "$/M tokens") if tokens else ("samples/s", "$/M samples")
    figures = ["step", rate_name, *(["MFU"] if mfu else []), *(BREAKDOWN.values() if breakdown else ())]
    figures += ["mem/rank", cost_name]
    g = Grid(title, cols + [Column(name, figure=True) for name in figures])
    shown = df if top <= 0 else df.head(top)
    for i, (_, r) in enumerate(shown.iterrows(), start=1):
        cells = [str(int(r["rank"])) if not with_cluster else str(i)]
        if with_cluster:
            cells.append(f"{int(r['nodes'])} x {r['topology']}")
        cells += [r["label"], *([r["layout"].replace(" ", "")] if layouts else [])]
        micro = f"{micro_batch(r):g}" + (f"×{int(r['grad_accum'])}" if accumulates else "")
        cells += [str(int(r["global_batch"])), micro][2 - batches :]
        rate = r["tokens_per_s_per_gpu"] if tokens else r["samples_per_s"]  # NaN: not simulated, "-"
        cells += [format_seconds(r["step_time_s"]), format_rate(rate), *([format_percent(r["mfu"])] if mfu else [])]
        if breakdown:
            cells += [format_seconds(r[k]) for k in BREAKDOWN]
        cost = r["cost_per_million_tokens_usd"] if tokens else r["cost_per_million_samples_usd"]
        cells += [_mem_cell(r), "-" if r["step_time_s"] != r["step_time_s"] else _fmt_cost(cost)]
        g.add(*cells, style=None if r["fits"] else "dim")
    return g, len(df) - len(shown)


def _ranked_table(out, df, title: str, top: int, with_cluster: bool, wide: bool):
    """The ranked table as it fits the console's width, with its breakdown columns where they fit
    (`wide`: always); how many rows were left below `top`; and the note that says what was left
    out and how to see it (None when nothing was)."""
    g, more = _ranked_grid(df, title, top, with_cluster)
    t = fitted(out, g, wide)
    if t is not None:
        return t, more, None
    how = f"left out to fit {out.width} columns: --wide shows them; --json and --out DIR hold every column"
    # the global batch goes first where every row runs the one the header names, then MFU, then the micro-batch
    held = mixed_batches_line(df) is None and not with_cluster
    steps = ((True, 2, ""), (True, 1 if held else 2, ""), (False, 1 if held else 2, " and MFU"))
    for mfu, batches, what in (*steps, (False, 0, ", MFU and the batch columns")):
        g, more = _ranked_grid(df, title, top, with_cluster, False, mfu, batches)
        t = fitted(out, g, wide)
        if t is not None:
            return t, more, f"{LEFT_OUT}{what} {how}"
    return layout(out, g), more, f"{LEFT_OUT}{what} {how}"


TIE = 0.001  # a margin below this (0.1 %) is a tie: it rounds to nothing at the printed precision


def versus(margin: float, other: str, error: dict | None = None) -> str:
    """``1.2% faster than X``, below `TIE` ``tied (within 0.1%) with X``, and inside the model's
    error on the device (`error`: a recommendation's ``model_error``, `model_error.ModelError.to_dict`;
    one written before it, or none: `economics.MODEL_ERROR`) the note that it is a tie until
    measured: one rule for every margin printed."""
    if margin < TIE:
        return f"tied (within {TIE * 100:g}%) with {other}"
    text = f"{margin * 100:.1f}% faster than {other}"
    if error and "band_pct" in error:
        if margin < error["band_pct"] / 100:
            how = "measured" if error.get("measured") else "not measured here"
            stack = error.get("stack", "this device")
            pct = f"±{error['band_pct']:.1f}%"
            text += f" (inside the model's stated error of {pct} on {stack}, {how}: a tie until measured)"
    elif margin < MODEL_ERROR:
        text += f" (inside the model's stated error of {MODEL_ERROR * 100:g}%: a tie until measured)"
    return text


def _describe(s: dict | None, batches: bool = False) -> str:
    """A recommended row: label, step, rates, MFU and cost (its batch where the sweep varies it)."""
    if s is None:
        return "-"
    rates = format_rate_unit(s["samples_per_s"], "samples")
    if s.get("tokens_per_s_per_gpu") is not None:
        rates += f", {format_rate_unit(s['tokens_per_s_per_gpu'], 'tokens')} per GPU, MFU {format_percent(s['mfu'])}"
    if batches and s.get("batch_per_device") is not None:
        rates += f", global batch {s['global_batch']}, micro-batch {micro_batch(_flat(s)):g} x {s['grad_accum']}"
    cost = s.get("cost_per_million_tokens_usd")
    if cost is None:
        cost = s.get("cost_per_million_samples_usd")
        unit = "samples"
    else:
        unit = "tokens"
    if cost is not None:
        rates += f", {_fmt_cost(cost)}/M {unit}"
    return f"{s['label']} ({format_seconds(s['step_time_s'])}/step, {rates})"


def _flat(s: dict) -> dict:
    """A recommended row's strategy fields as the table's columns name them (`strategy_pp`, ...)."""
    return s | {f"strategy_{k}": v for k, v in s.get("strategy", {}).items()}


def _degrees_line(b: dict) -> str:
    """The best layout's three degrees, and SageMaker model parallelism's keys for them."""
    d = b["degrees"]
    smp = ", ".join(f"{k} {v}" for k, v in b["sagemaker"].items())
    return (
        f"  layout {b['layout']}: tensor parallel {d['tp']}, pipeline {d['pp']}, data parallel {d['dp']} "
        f"sharded over {d['shard']} (SageMaker: {smp})"
    )


def _recommendation_lines(rec: dict, multi: bool, batches: bool = False, swept: tuple[str, ...] = ()) -> list[str]:
    """The recommendation's lines; `swept`: the kinds of the table's rows (where none is a
    data-parallel one, the missing sharded_data_parallel_degree says so)."""
    if rec["best"] is None:
        hint = f"; {rec['hint']}" if rec.get("hint") else ""
        return [f"[bold red]No recommendation:[/bold red] {rec['reason']}{hint}"]
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
            f" = {_describe(sdp, batches)}{sdp_where}"
        )
        if rec["sdp_runner_up"] is not None:
            line += "; " + versus(rec["sdp_margin"], rec["sdp_runner_up"]["label"], rec.get("model_error"))
            if rec["sdp_runner_up"]["nodes"] != sdp["nodes"] and multi:
                line += f" on {rec['sdp_runner_up']['nodes']} x {rec['sdp_runner_up']['topology']}"
        lines.append(line)
    elif swept and not set(swept) & set(DATA_PARALLEL):
        lines.append(f"No ddp/zero/zero2d configuration was swept (only {', '.join(swept)}).")
    else:
        lines.append("No ddp/zero/zero2d configuration fits in memory; only pipelines do.")
    line = f"[bold]Best configuration overall:[/bold] {_describe(rec['best'], batches)}{where}"
    if rec["runner_up"] is not None:
        ru = rec["runner_up"]
        ru_where = f" on {ru['nodes']} x {ru['topology']}" if multi else ""
        line += "; " + versus(rec["margin"], f"the runner-up, {ru['label']}{ru_where}", rec.get("model_error"))
    else:
        line += "; it is the only configuration that fits"
    lines.append(line)
    d = rec["best"].get("degrees")
    if d and (d["tp"] > 1 or d["pp"] > 1):  # a data-parallel layout: its degree is named above
        lines.append(_degrees_line(rec["best"]))
    if KINDS[rec["best"]["strategy"]["kind"]].is_pipeline and rec.get("margin_over_sdp") is not None:
        than = f"the best sharded data parallel configuration ({rec['sdp']['label']})"
        lines.append(f"The best pipeline is {versus(rec['margin_over_sdp'], than, rec.get('model_error'))}.")
    if multi and rec.get("cheapest"):
        c = rec["cheapest"]
        per = f"{_fmt_cost(c['cost_per_million_samples_usd'])} per million samples"
        if c.get("cost_per_million_tokens_usd") is not None:
            per += f", {_fmt_cost(c['cost_per_million_tokens_usd'])} per million tokens"
        lines.append(f"[bold]Cheapest per sample:[/bold] {c['label']} on {c['nodes']} x {c['topology']}, {per}")
    return lines


def _cluster_grid(df, rec) -> Grid:
    tokens = _tokens(df)
    rate_name, cost_name = ("tok/s/GPU", "$/M tokens") if tokens else ("samples/s", "$/M samples")
    figures = ("step", rate_name, "MFU", "scaling eff.", cost_name, "sdp degree")
    cols = [Column("cluster"), Column("GPUs", figure=True), Column("best")]
    g = Grid("Per cluster", cols + [Column(name, figure=True) for name in figures])
    for c in rec["clusters"]:
        b = c["best"]
        if b is None:
            g.add(f"{c['nodes']} x {c['topology']}", str(c["world"]), "[red]nothing fits[/red]", *[""] * len(figures))
            continue
        row = df[(df["topology"] == c["topology"]) & (df["nodes"] == c["nodes"]) & (df["label"] == b["label"])]
        eff = row["scaling_efficiency"].iloc[0] if "scaling_efficiency" in row and len(row) else float("nan")
        rate = b.get("tokens_per_s_per_gpu") if tokens else b["samples_per_s"]
        cost = b.get("cost_per_million_tokens_usd") if tokens else b["cost_per_million_samples_usd"]
        g.add(
            f"{c['nodes']} x {c['topology']}",
            str(c["world"]),
            b["label"],
            format_seconds(b["step_time_s"]),
            format_rate(float("nan") if rate is None else rate),
            format_percent(float("nan") if b.get("mfu") is None else b["mfu"]),
            "-" if eff != eff else f"{eff * 100:.0f}%",
            _fmt_cost(cost),
            "-" if c["sharded_data_parallel_degree"] is None else str(c["sharded_data_parallel_degree"]),
        )
    return g


def _efficiency_grids(df) -> list[Grid]:
    """Scaling efficiency of the ddp/zero/zero2d configurations (and the best pipelines), per GPU count."""
    from shardsim.sweep.ranking import scaling_configs

    tables = []
    for top, g in df.groupby("topology", sort=False):
        worlds = sorted(g["world"].unique())
        if len(worlds) < 2:
            continue
        mode = g["scaling_mode"].iloc[0]
        title = f"{mode.capitalize()} scaling efficiency on {top} (vs {int(worlds[0])} GPUs; ✗ = does not fit)"
        t = Grid(title, [Column("configuration"), *(Column(f"{int(w)}", figure=True) for w in worlds)])
        for cfg in scaling_configs(g):
            cells = []
            for w in worlds:
                r = g[(g["label"] == cfg) & (g["world"] == w)]
                if r.empty:
                    cells.append("")
                else:
                    r = r.iloc[0]
                    cells.append(f"{r['scaling_efficiency'] * 100:.0f}%" + ("" if r["fits"] else " ✗"))
            t.add(cfg, *cells)
        tables.append(t)
    return tables


def _stack_listed(df) -> list[tuple[str, list[str]]]:
    """The stack settings' values in the rows (`space.STACK_AXES`), each as labels name them."""
    out: list[tuple[str, list[str]]] = [("precision", list(dict.fromkeys(df["precision"])))]
    for name in ("optimizer", "attention"):
        if name in df:
            out.append((name, list(dict.fromkeys(df[name]))))
    if "compile" in df:
        out.append(("", ["compiled" if v else "eager" for v in dict.fromkeys(df["compile"])]))
    if "mlm_fraction" in df:
        out.append(
            ("mlm", [f"{v:g}" if v == v and v is not None else "off" for v in dict.fromkeys(df["mlm_fraction"])])
        )
    return out


def _values(df, column: str) -> str:
    return ",".join(str(int(v)) for v in sorted(df[column].unique()))


def _batch_text(df, base: RunConfig, global_batch: int | None, max_batch: int | None) -> str:
    """The batch of a sweep's header: the global batch each layout runs where it is held (given,
    strong scaling; or the data-parallel layout's, batch per device × world × grad_accum), else
    per device (the values the rows take, the search's limit where searched) and the accumulation steps."""
    held = mixed_batches_line(df) is None
    if global_batch is None and max_batch is None and held:
        return (
            f"global batch {_values(df, 'global_batch')} in every layout "
            f"(batch {base.batch_per_device}/device x grad_accum {base.grad_accum} where data parallel)"
        )
    if max_batch is not None:
        text = f"batch per device the largest that fits, up to {max_batch:,} (per row)"
    else:
        text = f"batch {_values(df, 'batch_per_device')}/device"
    gas = _values(df, "grad_accum")
    if gas != "1":
        text += f" x grad_accum {gas}"
    if global_batch is not None:
        text = f"global batch {global_batch} (strong scaling), {text}"
    return text


def _settings_listed(df) -> str:
    """ "ZeRO-3/ZeRO-2; checkpointing off/selective op; ...": the values of each setting in the
    rows, where the sweep listed settings ("" where it did not)."""
    if "checkpointing" not in df:
        return ""
    parts = []
    raf = sorted(df["strategy_reshard_after_forward"].dropna().unique(), reverse=True)
    if len(raf) > 1:
        parts.append("/".join("ZeRO-3" if v else "ZeRO-2" for v in raf))
    pairs = sorted(
        set(zip(df["checkpointing"], df["selective_ac_option"].fillna(""), strict=True)),
        key=lambda p: (CHECKPOINTING.index(p[0]), p[1]),
    )
    ckpt = [RunConfig(checkpointing=c, selective_ac_option=o or SAC_OP).checkpointing_label() for c, o in pairs]
    for name, values in (
        ("checkpointing", ckpt),
        ("reduce", sorted(df["reduce_dtype"].unique(), key=PRECISIONS.index)),
        ("implementation", sorted(df["optimizer_impl"].unique(), key=OPTIMIZER_IMPLS.index)),
        *_stack_listed(df),
    ):
        if len(values) > 1:
            parts.append((f"{name} " if name else "") + "/".join(values))
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
    wide: bool = False,
    max_batch: int | None = None,
) -> None:
    """The sweep on the terminal: the ranked table (per cluster and scaling efficiency when the
    sweep spans several), what does not fit, what was skipped, the recommendation and the files
    written. Rich markup, laid out for `console.output_width()`: a table too wide for it leaves
    out its breakdown columns and says so (`wide`: every column, whatever the width)."""
    out = console(wide=wide)
    clusters = list(df.groupby(["topology", "nodes"], sort=False))
    multi = len(clusters) > 1
    head = f"{display_name(base.workload, base.shape)}, " + _batch_text(df, base, global_batch, max_batch)
    seqs = sorted({int(v) for v in df["seq_len"].dropna()}) if "seq_len" in df else []
    if seqs:
        head += ", seq " + "/".join(f"{v:,}" for v in seqs)
    head += f", {base.precision}, checkpointing {base.checkpointing_label()}"
    if base.reduce_dtype is not None:
        head += f", reduce {base.grad_dtype}"
    if base.optimizer_impl != RunConfig.model_fields["optimizer_impl"].default:
        head += f", {base.optimizer} {base.optimizer_impl}"
    elif base.optimizer != RunConfig.model_fields["optimizer"].default:
        head += f", {base.optimizer}"
    if base.attention != RunConfig.model_fields["attention"].default:
        head += f", attention {base.attention}"
    if base.compile:
        head += ", compiled"
    if base.mlm_fraction is not None:
        head += f", mlm {base.mlm_fraction:g}"
    head += f", {base.backend}, {library_text(base.library)}"
    listed = _settings_listed(df)
    if listed:
        out.print(f"Settings listed (a configuration names those that differ from the base's): {listed}")
    if multi:
        out.print(f"Sweep of {len(df)} configurations over {len(clusters)} clusters: {head}")
        for g in (_cluster_grid(df, rec), *_efficiency_grids(df)):
            show(out, layout(out, g, wide))
        ranked = df.sort_values(["fits", "samples_per_s"], ascending=[False, False], kind="mergesort")
        title = "Leading configurations (all clusters, by samples/s)"
        table, more, left_out = _ranked_table(out, ranked, title, top, True, wide)
        show(out, table)
    else:
        (topology, nodes), g = clusters[0]
        title = f"{int(nodes)} x {topology} ({int(g['world'].iloc[0])} x {g['device'].iloc[0]}): {head}"
        title += f"; ranked by {'tokens/s per GPU' if _tokens(g) else 'samples/s'}"
        if mixed_batches_line(g) is None:
            title += " (one global batch: the order of step time)"
        table, more, left_out = _ranked_table(out, g, title, top, False, wide)
        show(out, table)
    if mixed := mixed_batches_line(df):
        out.print(mixed)
    if left_out:
        out.print(left_out)
    if more:
        out.print(f"… {more} more rows" + (" in the CSV" if files else " (--top 0 shows all, --out DIR saves them)"))
    if max_batch is not None:  # rows the search stopped at its limit: a larger batch may fit
        at_limit = int((df["fits"] & (df["batch_per_device"] >= max_batch)).sum())
        if at_limit:
            out.print(
                f"{at_limit} configuration{'s' if at_limit > 1 else ''} fit at the search's limit of {max_batch:,} "
                "samples per device: a larger batch may fit too (--max-batch N raises it)"
            )
    unfit = df[~df["fits"]]
    if len(unfit):
        line = (
            f"{len(unfit)} of {len(df)} configurations do not fit in memory (marked ✗; never recommended; "
            "not simulated)"
        )
        if more:  # some of them may be below the table's cut: name those that come closest to fitting
            names = [
                f"{r['label']}"
                + (f" on {int(r['nodes'])} x {r['topology']}" if multi else "")
                + f" ({format_bytes(r['memory_required_gib'] * GIB)})"
                for _, r in unfit.sort_values("memory_required_gib", kind="mergesort").head(3).iterrows()
            ]
            line += ": " + ", ".join(names) + (", …" if len(unfit) > 3 else ".")
        else:
            line += "."
        out.print(line)
    for line in skipped:
        out.print(f"[yellow]skipped[/yellow] {line}")
    batches = bool(df["batch_per_device"].nunique() > 1 or df["grad_accum"].nunique() > 1) or max_batch is not None
    batches = batches or bool(df["global_batch"].nunique() > 1)
    swept = tuple(dict.fromkeys(df["strategy_kind"]))
    for line in _recommendation_lines(rec, multi, batches, swept):
        out.print(line)
    if files:
        out.print(f"Wrote {len(files)} files to {out_dir}: " + ", ".join(sorted({f.rsplit("/", 1)[-1] for f in files})))
