"""Reading the CSV files shardsim reads back (a run folder's runs.csv, a calibration's
measurements) so that a torn or edited file is named, never read short.

`read_table` refuses, in one error naming the file, the line and the column: a file larger than
`CSV_BYTES` (before it is parsed: a device is not read on), a last line without
its line end (a write cut short: its last cell may be cut too, ``0.07558`` read as ``0.07``), a
row with more or fewer cells than the header has columns, a header naming a column twice, and a
cell that does not parse as its column's type (a pydantic type, read from text as pydantic
reads it: ``2``, ``0.5``, ``True``; an empty cell only where the type takes None). Blank lines
are skipped. Cells are returned as their text; callers convert what they use.
"""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardsim.core.errors import ConfigError

CSV_BYTES = 64 << 20  # a runs.csv of about 60,000 runs; larger is refused before it is parsed


@dataclass(frozen=True)
class Row:
    """One row of a table: the file's line it starts on (the header is line 1) and its cells by column."""

    line: int
    cells: dict[str, str]


@dataclass(frozen=True)
class Table:
    columns: list[str]
    rows: list[Row]


@functools.cache
def _adapter(kind: Any):
    from pydantic import TypeAdapter  # here: pydantic loads only when a typed table is read

    return TypeAdapter(kind)


def _check_cell(text: str, kind: Any, where: str, column: str, error: type[ConfigError]) -> None:
    from pydantic import ValidationError

    from shardsim.core.documents import describe

    try:
        _adapter(kind).validate_python(text if text.strip() else None)
    except ValidationError as exc:
        raise error(describe(exc)[1] if text.strip() else "empty", where=where, field=column) from None


def read_table(
    path: str | Path,
    types: Mapping[str, Any] | None = None,
    *,
    required: Iterable[str] = (),
    error: type[ConfigError] = ConfigError,
) -> Table:
    """The columns and rows of the CSV file at `path`, each row checked (see the module
    docstring); `types` gives the type of the columns it names, `required` the columns the
    header must have. What is wrong is an `error` (ConfigError or a subclass) naming the file
    and line (``runs.csv line 4``) and the column; OSError when the file cannot be read."""
    name = str(path)
    with open(path, "rb") as f:
        data = f.read(CSV_BYTES + 1)  # a device or a huge file is refused without reading on
    if len(data) > CSV_BYTES:
        raise error(f"larger than {CSV_BYTES >> 20} MiB, the most shardsim reads from a CSV file", where=name)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise error("not a CSV file: not UTF-8 text", where=name) from None
    if not text.strip():
        raise error("empty: no header line", where=name)
    if not text.endswith(("\n", "\r")):
        last = len(text.splitlines())
        what = "no line end after the last line: the file was cut short (truncated?); a whole file ends with one"
        raise error(what, where=f"{name} line {last}")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        columns = next(reader)
        seen: set[str] = set()
        for col in columns:
            if col in seen or not col.strip():
                what = f"column {col!r} appears twice" if col in seen else f"column {len(seen) + 1} has no name"
                raise error(f"header: {what}", where=f"{name} line 1")
            seen.add(col)
        for col in required:
            if col not in seen:
                raise error(f"no {col} column in the header", where=f"{name} line 1")
        checked = {c: k for c, k in (types or {}).items() if c in seen}
        rows: list[Row] = []
        start = reader.line_num + 1
        for cells in reader:
            where = f"{name} line {start}"
            if cells:  # a blank line has none
                if len(cells) < len(columns):
                    what = f"missing: the row has {len(cells)} of the header's {len(columns)} cells (truncated?)"
                    raise error(what, where=where, field=columns[len(cells)])
                if len(cells) > len(columns):
                    raise error(f"{len(cells)} cells; the header has {len(columns)} columns", where=where)
                row = dict(zip(columns, cells, strict=True))
                for col, kind in checked.items():
                    _check_cell(row[col], kind, where, col, error)
                rows.append(Row(start, row))
            start = reader.line_num + 1
    except csv.Error as exc:
        raise error(f"not a CSV file: {exc}", where=f"{name} line {reader.line_num}") from None
    return Table(columns, rows)
