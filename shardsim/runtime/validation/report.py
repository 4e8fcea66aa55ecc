"""What a validation reports: the summary (errors, and whether the predicted best is the
measured best), and its files ``validation.json`` (every row, read back to resume),
``validation.csv`` (the rows without their per-step lists) and ``validation.md``."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from shardsim.config import DATA_PARALLEL
from shardsim.core.files import atomic_write
from shardsim.core.units import format_seconds
from shardsim.runtime.validation.matrix import Matrix
from shardsim.runtime.validation.rows import Row
from shardsim.simulator.results import STRATEGY_COLUMNS, flatten

# validation.csv: every field of a row but its per-step lists, the key's strategy as
# `strategy_<field>` columns (`simulator.results.KEY_COLUMNS`)
CSV_COLUMNS = tuple(
    c
    for f in fields(Row)
    if not str(f.type).startswith("list[")
    for c in (STRATEGY_COLUMNS if f.name == "strategy" else (f.name,))
)


def _per_sample(r: Row, col: str) -> float:
    """Seconds of `col` per data-parallel rank's samples: the ranks of a tensor-parallel group
    share theirs, so a layout with tp > 1 trains world / tp ranks' batches a step (the matrix's
    batch per device is the same for every row)."""
    return getattr(r, col) * r.strategy.tp / r.world


def _best(rows: list[Row], col: str) -> Row:
    """The fastest row by `col` (predicted_s or measured_s), per sample."""
    return min(rows, key=lambda r: (_per_sample(r, col), r.label))


def summarize(rows: list[Row]) -> dict[str, Any]:
    """MAPE, largest error, and per topology whether the predicted best (configuration, and
    data-parallel degree), by time per sample, is the measured best."""
    ok = [r for r in rows if r.status == "ok" and not math.isnan(r.error_pct)]
    errs = [abs(r.error_pct) for r in ok]
    per_top = {}
    for top in dict.fromkeys(r.topology for r in ok):
        mine = [r for r in ok if r.topology == top]
        pb, mb = _best(mine, "predicted_s"), _best(mine, "measured_s")
        entry = {
            "predicted_best": pb.label,
            "measured_best": mb.label,
            "best_agrees": pb.label == mb.label,
            # how much slower, measured, the predicted-best configuration is than the measured best
            "regret_pct": 100 * (_per_sample(pb, "measured_s") / _per_sample(mb, "measured_s") - 1),
        }
        dp = [r for r in mine if r.strategy.kind in DATA_PARALLEL]
        if dp:
            pd_, md = _best(dp, "predicted_s"), _best(dp, "measured_s")
            entry |= {
                "predicted_best_degree": pd_.strategy.degree,
                "measured_best_degree": md.strategy.degree,
                "degree_agrees": pd_.strategy.degree == md.strategy.degree,
            }
        per_top[top] = entry
    return {
        "rows_ok": len(ok),
        "rows_stolen": sum(1 for r in ok if not r.host_quiet),
        "rows_failed": sum(1 for r in rows if r.status.startswith("failed")),
        "mape_pct": sum(errs) / len(errs) if errs else math.nan,
        "max_error_pct": max(errs) if errs else math.nan,
        "best_agrees": bool(per_top) and all(t["best_agrees"] for t in per_top.values()),
        "degree_agrees": bool(per_top) and all(t.get("degree_agrees", True) for t in per_top.values()),
        "topologies": per_top,
    }


def save(out: Path, matrix: Matrix, rows: list[Row], summary: dict[str, Any]) -> None:
    """Write validation.json, validation.csv and validation.md into `out`."""
    where = Path(matrix.path).resolve()
    shown = where.relative_to(Path.cwd()) if where.is_relative_to(Path.cwd()) else where
    doc = {"matrix": str(shown), "base": matrix.base, "steps": matrix.steps, "warmup": matrix.warmup}
    doc |= {"rows": [asdict(r) for r in rows], **summary}
    atomic_write(out / "validation.json", json.dumps(doc, indent=1, allow_nan=True) + "\n")
    atomic_write(out / "validation.csv", csv_text(rows))
    atomic_write(out / "validation.md", markdown(rows, summary))


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return str(v)


def csv_text(rows: list[Row]) -> str:
    """validation.csv: a header, then each row's `CSV_COLUMNS` (floats to 6 significant digits,
    NaN and None empty)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    flat = [flatten(asdict(r)) for r in rows]
    writer.writerows([_cell(row[c]) for c in CSV_COLUMNS] for row in flat)
    return buf.getvalue()


def markdown(rows: list[Row], summary: dict[str, Any]) -> str:
    lines = [
        "| topology | configuration | predicted | measured (min–max) | steps | steal | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.status != "ok":
            lines.append(f"| {r.topology} | {r.label} | {format_seconds(r.predicted_s)} | {r.status} | – | – | – |")
            continue
        n = len(r.step_times_s)
        steps = f"{r.steps_kept} of {n}" + ("" if r.host_quiet else " †") if n else "–"
        steal = f"{100 * r.host_steal_share:.0f} %" if math.isfinite(r.host_steal_share) else "–"
        lines.append(
            f"| {r.topology} | {r.label} | {format_seconds(r.predicted_s)} | {format_seconds(r.measured_s)} "
            f"({format_seconds(r.measured_min_s)}–{format_seconds(r.measured_max_s)}) | {steps} | {steal} "
            f"| {r.error_pct:+.1f} % |"
        )
    lines += [
        "",
        "steps: the quiet steps measured, of all run (every attempt); steal: the hypervisor's part of the",
        "host's cores' time in the steps measured. † too few quiet steps: measured over every step.",
        "",
        f"Mean absolute error {summary['mape_pct']:.1f} %, largest {summary['max_error_pct']:.1f} % "
        f"({summary['rows_ok']} configurations, {summary.get('rows_stolen', 0)} of them †).",
        "",
        "| topology | predicted best | measured best | agrees | regret | best degree (pred / meas) |",
        "|---|---|---|---|---|---|",
    ]
    for top, t in summary["topologies"].items():
        deg = f"{t.get('predicted_best_degree', '–')} / {t.get('measured_best_degree', '–')}"
        lines.append(
            f"| {top} | {t['predicted_best']} | {t['measured_best']} | {'yes' if t['best_agrees'] else 'no'} "
            f"| {t['regret_pct']:.1f} % | {deg} |"
        )
    return "\n".join(lines) + "\n"
