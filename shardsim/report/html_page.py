"""A sweep as one self-contained web page (`report.html`): the recommendation and its margin, the
ranked table (every row, sortable by a click on a header), the per-cluster and scaling tables
over several clusters, and the plots. The tables are the terminal's (`tables`), every cell
escaped; the plots are embedded as data: URIs, the style and the sorting script inline, and the
page's Content-Security-Policy lets it load nothing else."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardsim.core.files import atomic_write
from shardsim.report import tables
from shardsim.report.plots import units

if TYPE_CHECKING:
    import pandas as pd

    from shardsim.core.tables import Grid

NAME = "report.html"
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px; padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.rec p { margin: .3em 0; } .note { color: #555; }
table { border-collapse: collapse; margin: .5em 0; font-size: 12.5px; }
caption { text-align: left; font-weight: 600; padding: .3em 0; }
th, td { border-bottom: 1px solid #ddd; padding: 2px 6px; text-align: left; white-space: nowrap; }
th { background: #f3f3f3; position: sticky; top: 0; }
table.sortable th { cursor: pointer; } table.sortable th:hover { background: #e6e6e6; }
th[aria-sort=ascending]::after { content: " \\25B2"; } th[aria-sort=descending]::after { content: " \\25BC"; }
td.fig, th.fig { text-align: right; font-variant-numeric: tabular-nums; }
tr.unfit td { color: #888; } tr.unfit td.mark { color: #B00000; }
.scroll { max-height: 80vh; overflow: auto; display: inline-block; max-width: 100%; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
"""

# Sorts a table by the clicked header's column: a figure by its value in base units (1.2 ms < 1 s,
# 900 MiB < 1 GiB), text by its words; cells without a figure ("-", "unknown") last either way.
SCRIPT = """
const UNIT = {ns: 1e-9, "\\u00b5s": 1e-6, ms: 1e-3, s: 1, min: 60, h: 3600,
  B: 1, KiB: 2 ** 10, MiB: 2 ** 20, GiB: 2 ** 30, TiB: 2 ** 40};
function figure(text) {
  const m = text.replace(/[$,]/g, "").match(/^\\s*(-?\\d+(?:\\.\\d+)?(?:e[+-]?\\d+)?)\\s*([A-Za-z\\u00b5]*)/);
  return m ? parseFloat(m[1]) * (UNIT[m[2]] || 1) : null;
}
function sortBy(th) {
  const table = th.closest("table"), body = table.tBodies[0], col = th.cellIndex;
  const up = th.getAttribute("aria-sort") !== "ascending";
  for (const h of table.tHead.rows[0].cells) h.removeAttribute("aria-sort");
  th.setAttribute("aria-sort", up ? "ascending" : "descending");
  const fig = th.classList.contains("fig"), sign = up ? 1 : -1;
  const keyed = Array.from(body.rows, (r) => {
    const text = r.cells[col].textContent;
    return [fig ? figure(text) : text.trim() || null, r];
  });
  keyed.sort((a, b) => {
    if (a[0] === null || b[0] === null) return (a[0] === null) - (b[0] === null);
    return sign * (fig ? a[0] - b[0] : a[0].localeCompare(b[0], undefined, {numeric: true}));
  });
  for (const [, r] of keyed) body.appendChild(r);
}
for (const th of document.querySelectorAll("table.sortable th")) th.addEventListener("click", () => sortBy(th));
"""


def _plain(markup: str) -> str:
    """A cell's text without its rich markup (the text itself where it is not valid markup)."""
    from rich.errors import MarkupError
    from rich.text import Text

    try:
        return Text.from_markup(markup).plain
    except MarkupError:
        return markup


def grid_html(grid: Grid, sortable: bool = False) -> str:
    """A table of `grid`, every cell escaped; a row styled dim (a configuration that does not fit)
    is of class unfit, its cells with ✗ of class mark."""
    e = html.escape
    head = "".join(f"<th{' class=fig' if c.figure else ''} scope=col>{e(c.header)}</th>" for c in grid.columns)
    body = []
    for cells, style in grid.rows:
        tds = []
        for c, cell in zip(grid.columns, cells, strict=True):
            text = _plain(cell)
            cls = " ".join(k for k, on in (("fig", c.figure), ("mark", "✗" in text)) if on)
            tds.append(f"<td{f' class={cls!r}' if cls else ''}>{e(text)}</td>")
        body.append(f"<tr{' class=unfit' if style == 'dim' else ''}>{''.join(tds)}</tr>")
    caption = f"<caption>{e(grid.title)}</caption>" if grid.title else ""
    cls = ' class="sortable"' if sortable else ""
    return f"<table{cls}>{caption}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    name = html.escape(path.stem.replace("_", " "))
    return f'<figure><img src="data:image/png;base64,{data}" alt="{name}"><figcaption>{name}</figcaption></figure>'


def report_html(df: pd.DataFrame, rec: dict[str, Any], images: list[Path], command: str | None = None) -> str:
    """The page of a sweep's rows `df` (ranked as the sweep returns them), its recommendation
    `rec` and the PNG plots `images` (in that order)."""
    e = html.escape
    clusters = df.groupby(["topology", "nodes"], sort=False).ngroups
    multi = clusters > 1
    batches = bool(df["batch_per_device"].nunique() > 1 or df["grad_accum"].nunique() > 1)
    workload = str(df["workload"].iloc[0])
    u = units(df)
    parts = [f"<h1>shardsim sweep: {e(workload)}</h1>"]
    if command:
        parts.append(f"<p class=note>{e(command)}</p>")
    parts.append("<section class=rec><h2>Recommendation</h2>")
    parts += [f"<p>{e(_plain(line))}</p>" for line in tables._recommendation_lines(rec, multi, batches)]
    unfit = int((~df["fits"]).sum())
    if unfit:
        parts.append(
            f"<p class=note>{unfit} of {len(df)} configurations do not fit in memory: marked ✗ and greyed in the "
            "table, never recommended, not simulated.</p>"
        )
    parts.append("</section>")
    if multi:
        parts.append("<h2>Per cluster and scaling</h2>")
        parts += [grid_html(g) for g in (tables._cluster_grid(df, rec), *tables._efficiency_grids(df))]
        ranked = df.sort_values(["fits", "samples_per_s"], ascending=[False, False], kind="mergesort")
        title = f"Every configuration (all {clusters} clusters, by samples/s)"
    else:
        ranked = df
        title = f"Every configuration ({int(df['nodes'].iloc[0])} x {df['topology'].iloc[0]}, ranked)"
    grid, _ = tables._ranked_grid(ranked, title, 0, with_cluster=multi)
    rate = "in tokens per second per GPU and USD per million tokens" if u.tokens else "in samples/s"
    parts.append(f"<h2>Ranked configurations</h2><p class=note>Rates {e(rate)}; click a header to sort.</p>")
    parts.append(f"<div class=scroll>{grid_html(grid, sortable=True)}</div>")
    if images:
        parts.append("<h2>Plots</h2>")
        parts += [_image(p) for p in images]
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(workload)}: shardsim sweep</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(parts)
        + f"\n<script>{SCRIPT}</script>\n</body></html>\n"
    )


def write_html_report(
    df: pd.DataFrame, rec: dict[str, Any], out: str | Path, images: list[Path], command: str | None = None
) -> Path:
    """`report_html` written to `out`/report.html (the PNGs of `images`, SVGs left out)."""
    path = Path(out) / NAME
    atomic_write(path, report_html(df, rec, [p for p in images if p.suffix == ".png"], command))
    return path
