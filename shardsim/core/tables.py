"""Tables on the terminal that fit its width: ruled where they fit, else compact, with text
cells wrapped at spaces, and where even their longest words do not fit, folded; a figure is
never folded, and no cell is ever cut short. Where even the figures do not fit, the table is
printed at its own width, its lines longer than the terminal's (`layout`, `show`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardsim.core.console import UNLIMITED

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


@dataclass(frozen=True)
class Column:
    header: str
    figure: bool = False  # right-aligned and never wrapped (a number with its unit)


@dataclass
class Grid:
    """A table's title, columns and rows (rich markup in cells), before it is laid out."""

    title: str | None
    columns: list[Column]
    rows: list[tuple[list[str], str | None]] = field(default_factory=list)  # cells, row style

    def add(self, *cells: str, style: str | None = None) -> None:
        self.rows.append((list(cells), style))

    def render(self, compact: bool = False, widths: list[int | None] | None = None) -> Table:
        """Ruled, or `compact` (no vertical rules, two spaces between columns, a figure's header
        one word a line); `widths` fixes the width of some columns."""
        from rich import box
        from rich.table import Table

        style = {"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False, "collapse_padding": True}
        t = Table(title=self.title, title_justify="left", header_style="bold", **(style if compact else {}))
        for i, c in enumerate(self.columns):
            header = c.header.replace(" ", "\n") if compact and c.figure else c.header
            width = widths[i] if widths else None
            t.add_column(
                header, justify="right" if c.figure else "left", overflow="fold", no_wrap=c.figure, width=width
            )
        for cells, row_style in self.rows:
            t.add_row(*cells, style=row_style)
        return t


def natural_width(out: Console, t: Table) -> int:
    """The width `t` takes when nothing in it wraps."""
    from rich.measure import Measurement

    return Measurement.get(out, out.options.update(max_width=UNLIMITED), t).maximum


def _spans(out: Console, grid: Grid) -> tuple[list[tuple[int, int]], int]:
    """Each column's (narrowest, widest) width in the compact table (a text column's narrowest is
    its longest word; a figure's, its widest cell) and what the rules and padding take."""
    from rich.measure import Measurement
    from rich.text import Text

    opts = out.options.update(max_width=UNLIMITED)
    spans: list[tuple[int, int]] = []
    for i, c in enumerate(grid.columns):
        header = c.header.replace(" ", "\n") if c.figure else c.header
        cells = [Text.from_markup(header), *(Text.from_markup(cells[i]) for cells, _ in grid.rows)]
        ms = [Measurement.get(out, opts, cell) for cell in cells]
        widest = max(m.maximum for m in ms)
        spans.append((widest if c.figure else max(m.minimum for m in ms), widest))
    return spans, natural_width(out, grid.render(compact=True)) - sum(hi for _, hi in spans)


def _narrowed(out: Console, grid: Grid) -> list[int | None] | None:
    """Widths for the compact table's text columns that make it fit `out`: what the figures leave,
    shared in proportion to how much each text column would wrap, each at least its longest word;
    None when even that does not fit."""
    spans, rules = _spans(out, grid)
    spare = out.width - rules - sum(lo for lo, _ in spans)
    if spare < 0:
        return None
    want = sum(hi - lo for lo, hi in spans) or 1
    widths: list[int | None] = []
    for c, (lo, hi) in zip(grid.columns, spans, strict=True):
        widths.append(None if c.figure else min(hi, lo + spare * (hi - lo) // want))
    return widths


FOLD_MIN = 8  # a text column is folded (its long words broken, nothing lost) down to this, not below


def _folded(out: Console, grid: Grid) -> list[int | None]:
    """Widths for a compact table whose longest words do not fit `out`: the text columns share
    what the figures leave, their long words folded, each at least `FOLD_MIN` (its longest word
    where that is shorter); where even that does not fit, each at its longest word, and the
    table runs past `out`'s width. A figure keeps its width: it is never folded or cut."""
    spans, rules = _spans(out, grid)
    text = [i for i, c in enumerate(grid.columns) if not c.figure]
    room = out.width - rules - sum(hi for c, (_, hi) in zip(grid.columns, spans, strict=True) if c.figure)
    floor = {i: min(spans[i][0], FOLD_MIN) for i in text}
    widths: list[int | None] = [None] * len(grid.columns)
    extra = room - sum(floor.values())
    want = sum(spans[i][0] - floor[i] for i in text) or 1
    for i in text:
        widths[i] = floor[i] + extra * (spans[i][0] - floor[i]) // want if extra >= 0 else spans[i][0]
    return widths


def fitted(out: Console, grid: Grid, wide: bool = False) -> Table | None:
    """`grid` ruled if it fits `out`'s width (or `wide`), else compact, else compact with its text
    columns narrowed and wrapped at spaces; None when even its longest words do not fit."""
    ruled = grid.render()
    if wide or natural_width(out, ruled) <= out.width:
        return ruled
    compact = grid.render(compact=True)
    if natural_width(out, compact) <= out.width:
        return compact
    widths = _narrowed(out, grid)
    return None if widths is None else grid.render(compact=True, widths=widths)


def layout(out: Console, grid: Grid, wide: bool = False) -> Table:
    """`grid` as it fits `out` (`fitted`), else compact with its text columns folded to fit (and
    where even the figures do not fit, wider than `out`: see `_folded` and `show`)."""
    return fitted(out, grid, wide) or grid.render(compact=True, widths=_folded(out, grid))


def show(out: Console, table: Table) -> None:
    """Print `table` on `out` whole: one wider than `out` is printed at its own width (its lines
    run past `out`'s) rather than with its cells cut short to fit."""
    need = natural_width(out, table)
    if need <= out.width:
        out.print(table)
        return
    width = out.width
    out.width = need
    try:
        out.print(table)
    finally:
        out.width = width
