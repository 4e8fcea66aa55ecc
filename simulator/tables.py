"""Tables on the terminal that fit its width: ruled where they fit, else compact, with text
cells wrapped at spaces; a cell is never cut short with an ellipsis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardsim.simulator.console import UNLIMITED

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


def _narrowed(out: Console, grid: Grid) -> list[int | None] | None:
    """Widths for the compact table's text columns that make it fit `out`: what the figures leave,
    shared in proportion to how much each text column would wrap, each at least its longest word;
    None when even that does not fit."""
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
    rules = natural_width(out, grid.render(compact=True)) - sum(hi for _, hi in spans)
    spare = out.width - rules - sum(lo for lo, _ in spans)
    if spare < 0:
        return None
    want = sum(hi - lo for lo, hi in spans) or 1
    widths: list[int | None] = []
    for c, (lo, hi) in zip(grid.columns, spans, strict=True):
        widths.append(None if c.figure else min(hi, lo + spare * (hi - lo) // want))
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
