"""Measured collectives as nccl-tests reports them: its text output (``all_reduce_perf``,
``all_gather_perf``, ``reduce_scatter_perf``, ``broadcast_perf``, ...) or the repository's CSV
form (``experiments/calibration/data/nccl-*.csv``), read into one `NcclTestsResult`.

nccl-tests' text, as version 2.x prints it::

    # nThread 1 nGpus 1 minBytes 8 maxBytes 17179869184 step: 2(factor) warmup iters: 5 iters: 100 ...
    #  Rank  0 Group  0 Pid  41021 on   node-a device  0 [0x53] NVIDIA H100 80GB HBM3
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time ...
           8             2     float     sum      -1    69.12    0.00    0.00      0    72.43 ...
    # Avg bus bandwidth    : 123.45

Lines starting with ``#`` are headers; the ``Rank`` lines give the ranks (one a line) and the
nodes (their distinct host names); each other line is one size: size, count, type, redop,
root (absent before nccl-tests 2.11), then time (us), algbw and busbw (GB/s) and the error count,
out of place and in place. NCCL's own log lines (``NCCL INFO``, ``NCCL WARN``), which
``NCCL_DEBUG`` interleaves, and blank lines are skipped; any other line is refused. A row of size
0, or whose out-of-place time or bandwidth is 0 or no number (``nan``), is dropped: kept aside as
a `DroppedRow`, which `dropped_line` counts and names in one line.

A log may hold several sections, one a test binary's run (``all_reduce_perf`` then
``all_gather_perf``): each starts at its ``# Collective test starting`` or ``# nThread`` line and
has its own Rank lines, table and collective (`read_nccl_tests_sections`).

A section's table does not name its collective. It is, in this order: the one given, the one a
``# Collective test starting: all_reduce_perf`` line names (recent nccl-tests print it), the one the file's
name names (``all_reduce_perf.log``, ``nccl-all-reduce-p5.csv``; a file of one section), or the one the table implies
(redop ``none`` with a root ≥ 0 is broadcast; a count per rank, size / (element size × ranks), is
all_gather without a reduction and reduce_scatter with one; a whole count with a reduction is
all_reduce). The table alone cannot tell all_reduce from sendrecv nor all_gather from all_to_all
(``alltoall_perf`` prints a count per peer): name those in the file name or give the collective.

A file is at most `NCCL_TESTS_BYTES` (refused before it is read) and `NCCL_TESTS_ROWS` result rows
(refused at the first beyond, before any is predicted).

Pure Python (no simpy), so that the calibration can read files without the simulator.
"""

from __future__ import annotations

import csv
import hashlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import read_text

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "send_recv",
    "all_to_all",
    "gather",
    "scatter",
    "hypercube",
)
_FILE_NAMES = {  # how a file name spells a collective (nccl-tests' binaries, the repository's CSVs)
    "all_reduce": ("all_reduce", "all-reduce", "allreduce"),
    "all_gather": ("all_gather", "all-gather", "allgather"),
    "reduce_scatter": ("reduce_scatter", "reduce-scatter", "reducescatter"),
    "broadcast": ("broadcast",),
    "send_recv": ("sendrecv", "send_recv", "send-recv"),
    "all_to_all": ("alltoall", "all_to_all", "all-to-all"),
    "hypercube": ("hypercube",),
    "gather": ("gather",),
    "scatter": ("scatter",),
    "reduce": ("reduce",),
}
ELEMENT_BYTES = {
    "int8": 1,
    "uint8": 1,
    "half": 2,
    "bfloat16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int32": 4,
    "uint32": 4,
    "float": 4,
    "int64": 8,
    "uint64": 8,
    "double": 8,
}
CSV_COLUMNS = (
    "size_bytes",
    "time_us",
    "algbw_GBps",
    "busbw_GBps",
    "inplace_time_us",
    "inplace_algbw_GBps",
    "inplace_busbw_GBps",
)
_NCCL_LOG = re.compile(r"\bNCCL (INFO|WARN|TRACE|ABORT)\b")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_NTHREAD = re.compile(r"^#\s*nThread\b")
_TABLE_HEADER = re.compile(r"^#\s*size\s+count\s+type")
NCCL_TESTS_BYTES = 64 << 20  # a log with NCCL_DEBUG=INFO lines of thousands of ranks; larger is refused unread
NCCL_TESTS_ROWS = 1024  # result rows of a file (8 B to 16 GiB doubling is 32 a section); more is refused at once
NO_NODES = "the file names no ranks or nodes (nccl-tests' '# Rank' lines); give the node count (--nodes)"
_NAMED_DROPPED = 3  # dropped rows named in the line that counts them; the rest counted


@dataclass(frozen=True)
class NcclTestsRow:
    """One size: out-of-place time and bandwidths (nccl-tests' first columns), in place beside."""

    size_bytes: int
    count: int | None
    type: str | None
    redop: str | None
    root: int | None
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    inplace_time_us: float | None
    inplace_algbw_GBps: float | None
    inplace_busbw_GBps: float | None


@dataclass(frozen=True)
class DroppedRow:
    """A row left out: its line, its size and why (``time 0``, ``time 'nan'``, ``size 0``)."""

    line: int
    size_bytes: int
    why: str


@dataclass(frozen=True)
class NcclTestsResult:
    """A file (or one section of it) of measured sizes: its collective, ranks and nodes where the
    file says them, the rows kept and those dropped (`dropped`; `read` counts both)."""

    path: str
    collective: str
    ranks: int | None
    nodes: int | None
    rows: tuple[NcclTestsRow, ...]
    avg_busbw_GBps: float | None = None
    dropped: tuple[DroppedRow, ...] = ()
    line: int = 1  # where the section starts
    sha256: str = ""  # of the whole file as read

    @property
    def read(self) -> int:
        return len(self.rows) + len(self.dropped)

    def describe(self) -> str:
        """``all_reduce, 8 ranks on 2 nodes (line 1)``, as a refusal names a section."""
        where = f", {self.ranks} ranks on {self.nodes} nodes" if self.ranks else ""
        return f"{self.collective}{where} (line {self.line})"


def dropped_line(results: tuple[NcclTestsResult, ...] | list[NcclTestsResult]) -> str | None:
    """One line counting and naming the rows left out of `results` (one file's sections), or None:
    ``all_gather_perf.log: dropped 1 row of 11: size 8 B (time 0, line 14)``."""
    dropped = [d for r in results for d in r.dropped]
    if not dropped:
        return None
    total = sum(r.read for r in results)
    named = ", ".join(f"size {d.size_bytes} B ({d.why}, line {d.line})" for d in dropped[:_NAMED_DROPPED])
    more = f" and {len(dropped) - _NAMED_DROPPED} more" if len(dropped) > _NAMED_DROPPED else ""
    rows = "row" if len(dropped) == 1 else "rows"
    return f"{results[0].path}: dropped {len(dropped)} {rows} of {total}: {named}{more}"


def read_nccl_tests(path: str | Path, collective: str | None = None) -> NcclTestsResult:
    """nccl-tests' text output or the repository's CSV form (by the header), as one `NcclTestsResult`.

    A file of several sections (one a test binary's run) is read as one where they measured the
    same collective on the same ranks; with `collective` given, the sections of that collective;
    otherwise it is refused, naming the sections found. A file that cannot be read or holds a line
    neither form allows is one `ConfigError` naming the file and line."""
    sections = read_nccl_tests_sections(path, collective)
    kinds = {(s.collective, s.ranks, s.nodes) for s in sections}
    if len(kinds) > 1:
        found = "; ".join(s.describe() for s in sections)
        raise ConfigError(
            f"{path}: {len(sections)} sections of different collectives or ranks ({found}); "
            "one file a collective, or choose one (--op)"
        )
    rows = tuple(r for s in sections for r in s.rows)
    dropped = tuple(d for s in sections for d in s.dropped)
    if not rows:
        raise _no_rows(path, dropped)
    return replace(sections[0], rows=rows, dropped=dropped)


def _no_rows(path: str | Path, dropped: tuple[DroppedRow, ...] | list[DroppedRow]) -> ConfigError:
    """A file whose every row is dropped, with the line that names them."""
    result = NcclTestsResult(str(path), "", None, None, (), dropped=tuple(dropped))
    return ConfigError(f"{path}: no sizes above 0 bytes with a time; {dropped_line([result]).split(': ', 1)[1]}")


def read_nccl_tests_sections(path: str | Path, collective: str | None = None) -> tuple[NcclTestsResult, ...]:
    """Each section of the file (the CSV form is one) as its own `NcclTestsResult`, with its own
    collective, ranks and nodes; with `collective` given, only the sections of it (a file of one
    section is read as it). The file is at most `NCCL_TESTS_BYTES` (checked before it is read)
    and `NCCL_TESTS_ROWS` result rows."""
    p = Path(path)
    if collective is not None and collective not in COLLECTIVES:
        raise ConfigError(f"expected one of {', '.join(COLLECTIVES)}, got {collective!r}", field="op")
    text = read_text(p, limit=NCCL_TESTS_BYTES)
    first = next((line for line in _lines(text) if line.strip()), "")
    if first.replace(" ", "").startswith("size_bytes,"):
        sections = [_read_csv(p, text, collective)]
    else:
        sections = _read_text(p, text, collective)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return tuple(replace(s, sha256=digest) for s in sections)


def _lines(text: str) -> Iterator[str]:
    """The lines of `text` (ended by ``\\n`` or ``\\r\\n``), one at a time: a file refused at a line is
    not split beyond it."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        yield text[start:end].removesuffix("\r")
        start = end + 1


def _refuse(p: Path, line_no: int, what: str) -> ConfigError:
    return ConfigError(what, where=f"{p}:{line_no}")


def _number(p: Path, line_no: int, text: str, name: str, kind=float):
    try:
        value = kind(text)
    except ValueError:
        raise _refuse(p, line_no, f"{name} {text!r} is not a number") from None
    if kind is float and (not math.isfinite(value) or value < 0):
        raise _refuse(p, line_no, f"{name} {text!r} is not a finite number >= 0")
    return value


def _measure(text: str) -> float | None:
    """A time or bandwidth as nccl-tests prints it: a finite number >= 0, else None (``nan``, ``N/A``)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


@dataclass
class _Section:
    line: int
    started: str | None = None
    nthread: bool = False
    header: bool = False
    avg: float | None = None
    ranks: dict[int, str] = field(default_factory=dict)
    rows: list[NcclTestsRow] = field(default_factory=list)
    dropped: list[DroppedRow] = field(default_factory=list)

    @property
    def has_rows(self) -> bool:
        return bool(self.rows or self.dropped)


def _read_text(p: Path, text: str, collective: str | None) -> list[NcclTestsResult]:
    """The file's sections: each starts at a ``# Collective test starting`` or ``# nThread`` line
    (nccl-tests prints them at a test's start) after the section before it has begun."""
    sections = [_Section(1)]
    n_rows = 0
    for line_no, raw in enumerate(_lines(text), start=1):
        line = raw.strip()
        if not line or _NCCL_LOG.search(line):
            continue
        s = sections[-1]
        if line.startswith("#"):
            if m := _STARTING.match(line):
                if s.has_rows or s.started or s.nthread:
                    sections.append(s := _Section(line_no))
                s.started = _spelled(m.group(1))
            elif _NTHREAD.match(line):
                if s.has_rows or s.nthread:
                    sections.append(s := _Section(line_no))
                s.nthread = s.header = True
            elif m := _RANK.match(line):
                if s.has_rows:
                    sections.append(s := _Section(line_no))
                rank = int(m.group(1))
                if rank in s.ranks:
                    raise _refuse(p, line_no, f"rank {rank} is listed twice")
                s.ranks[rank] = m.group(2)
            elif m := _AVG.match(line):
                s.avg = _measure(m.group(1))  # a summary only: nan where no size had a time
            elif _TABLE_HEADER.match(line):
                s.header = True
            continue
        n_rows += 1
        if n_rows > NCCL_TESTS_ROWS:
            raise _refuse(p, line_no, f"more than {NCCL_TESTS_ROWS:,} result rows, the most shardsim reads from a file")
        row = _row(p, line_no, line.split())
        if isinstance(row, DroppedRow):
            s.dropped.append(row)
        else:
            s.rows.append(row)
    begun = [s for s in sections if s.has_rows or s.ranks]
    if not begun:
        saw_header = any(s.header for s in sections)
        what = "no result table" if saw_header else "no nccl-tests output (no '# nThread' line, no result table)"
        raise ConfigError(f"{p}: {what}")
    if len(begun) == 1:
        return [_result(p, begun[0], collective, _named(p))]
    out = [_result(p, s, None, None) for s in begun]
    chosen = [r for r in out if collective in (None, r.collective)]
    if not chosen:
        found = "; ".join(r.describe() for r in out)
        raise ConfigError(f"{p}: no {collective} section ({found})", field="op")
    return chosen


def _result(p: Path, s: _Section, collective: str | None, named: str | None) -> NcclTestsResult:
    ranks = s.ranks
    if ranks and sorted(ranks) != list(range(len(ranks))):
        raise ConfigError(f"{p}:{s.line}: the Rank lines list ranks {sorted(ranks)}, not 0 to {len(ranks) - 1}")
    n = len(ranks) or None
    nodes = len(set(ranks.values())) or None
    if not s.has_rows:
        raise ConfigError(f"{p}:{s.line}: no result table after the Rank lines")
    all_rows = s.rows
    op = collective or s.started or named or (_implied(p, s.line, all_rows, n) if all_rows else None)
    if op is None:
        raise _no_rows(p, s.dropped)
    return NcclTestsResult(str(p), op, n, nodes, tuple(s.rows), s.avg, tuple(s.dropped), s.line)


def _row(p: Path, line_no: int, f: list[str]) -> NcclTestsRow | DroppedRow:
    """One table line: 12 fields (no root column) or 13 (with it); a row whose size is 0 or whose
    out-of-place time is 0 or no number (``nan``) is a `DroppedRow`."""
    if len(f) not in (12, 13):
        raise _refuse(
            p,
            line_no,
            f"expected a result row (size count type redop [root] time algbw busbw #wrong ×2), got {len(f)} fields",
        )
    size = _number(p, line_no, f[0], "size", int)
    count = _number(p, line_no, f[1], "count", int)
    if size < 0 or count < 0:
        raise _refuse(p, line_no, "a size or count below 0")
    dtype, redop = f[2], f[3]
    if dtype not in ELEMENT_BYTES:
        raise _refuse(p, line_no, f"type {dtype!r} is not one of nccl-tests' ({', '.join(ELEMENT_BYTES)})")
    root = _number(p, line_no, f[4], "root", int) if len(f) == 13 else None
    out, inp = f[-8:-4], f[-4:]
    for wrong in (out[3], inp[3]):
        if wrong != "N/A" and _number(p, line_no, wrong, "#wrong") != 0:
            raise _refuse(p, line_no, f"nccl-tests found {wrong} wrong values at this size: the data is not valid")
    return _kept(line_no, size, out[:3], (count, dtype, redop, root), [_measure(x) for x in inp[:3]])


def _kept(line_no: int, size: int, out: list[str], table: tuple, inplace: list[float | None]):
    """The row, or why it is dropped: size 0 (nothing moves), a time of 0 or one that is no number."""
    if size == 0:
        return DroppedRow(line_no, size, "size 0: nothing moves")
    values = [_measure(x) for x in out]
    for text, value, name in zip(out, values, ("time", "algbw", "busbw"), strict=True):
        if value is None:
            return DroppedRow(line_no, size, f"{name} {text!r}")
    if values[0] == 0:
        return DroppedRow(line_no, size, "time 0")
    return NcclTestsRow(size, *table, *values, *inplace)


def _named(p: Path) -> str | None:
    return _spelled(p.name)


def _spelled(text: str) -> str | None:
    """The collective a name spells (``all_reduce_perf``, ``nccl-all-reduce-p5.csv``), if any."""
    name = text.lower()
    for op, spellings in _FILE_NAMES.items():  # longer names first: reduce_scatter before reduce
        if any(s in name for s in spellings):
            return op
    return None


def _implied(p: Path, line: int, rows: list[NcclTestsRow], ranks: int | None) -> str:
    r = max(rows, key=lambda r: r.size_bytes)
    whole = r.count * ELEMENT_BYTES[r.type] == r.size_bytes
    reduces = r.redop != "none"
    if not reduces and r.root is not None and r.root >= 0:
        return "broadcast"
    if reduces and whole and (r.root is None or r.root < 0):
        return "all_reduce"
    if ranks and r.count * ELEMENT_BYTES[r.type] * ranks == r.size_bytes and (r.root is None or r.root < 0):
        return "reduce_scatter" if reduces else "all_gather"
    where = f"{p}:{line}" if line > 1 else str(p)
    raise ConfigError(
        f"{where}: cannot tell which collective the table measured; name it in the file name or give it (--op)"
    )


def _read_csv(p: Path, text: str, collective: str | None) -> NcclTestsResult:
    reader = csv.reader(_lines(text))
    header = [h.strip() for h in next(reader)]
    if tuple(header) != CSV_COLUMNS:
        raise ConfigError(f"expected the columns {','.join(CSV_COLUMNS)}", where=f"{p}:1")
    rows: list[NcclTestsRow] = []
    dropped: list[DroppedRow] = []
    for line_no, f in enumerate(reader, start=2):
        if not any(x.strip() for x in f):
            continue
        if len(rows) + len(dropped) >= NCCL_TESTS_ROWS:
            raise _refuse(p, line_no, f"more than {NCCL_TESTS_ROWS:,} result rows, the most shardsim reads from a file")
        if len(f) != len(CSV_COLUMNS):
            raise _refuse(p, line_no, f"expected {len(CSV_COLUMNS)} values, got {len(f)}")
        size = _number(p, line_no, f[0].strip(), "size_bytes", int)
        if size < 1:
            raise _refuse(p, line_no, "size_bytes below 1")
        cells = [x.strip() for x in f[1:]]
        row = _kept(line_no, size, cells[:3], (None, None, None, None), [_measure(x) for x in cells[3:]])
        (dropped if isinstance(row, DroppedRow) else rows).append(row)
    if not rows and not dropped:
        raise ConfigError(f"{p}: no rows")
    op = collective or _named(p)
    if op is None:
        raise ConfigError(
            f"{p}: cannot tell which collective the file measured; name it in the file name or give it (--op)"
        )
    return NcclTestsResult(str(p), op, None, None, tuple(rows), dropped=tuple(dropped))
