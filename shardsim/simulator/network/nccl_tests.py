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
``NCCL_DEBUG`` interleaves, and blank lines are skipped; any other line is refused.

The table does not name its collective. It is, in this order: the one given, the one a
``# Collective test starting: all_reduce_perf`` line names (recent nccl-tests print it), the one the file's
name names (``all_reduce_perf.log``, ``nccl-all-reduce-p5.csv``), or the one the table implies
(redop ``none`` with a root ≥ 0 is broadcast; a count per rank, size / (element size × ranks), is
all_gather without a reduction and reduce_scatter with one; a whole count with a reduction is
all_reduce). The table alone cannot tell all_reduce from sendrecv nor all_gather from alltoall:
name those in the file name or give the collective.

Pure Python (no simpy), so that the calibration can read files without the simulator.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from shardsim.core.errors import ConfigError

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "send_recv",
    "alltoall",
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
    "alltoall": ("alltoall", "all_to_all", "all-to-all"),
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
class NcclTestsResult:
    """A file of measured sizes: its collective, ranks and nodes where the file says them."""

    path: str
    collective: str
    ranks: int | None
    nodes: int | None
    rows: tuple[NcclTestsRow, ...]
    avg_busbw_GBps: float | None = None


def read_nccl_tests(path: str | Path, collective: str | None = None) -> NcclTestsResult:
    """nccl-tests' text output or the repository's CSV form (by the header), as `NcclTestsResult`.

    A file that cannot be read or holds a line neither form allows is one `ConfigError` naming
    the file and line."""
    p = Path(path)
    if collective is not None and collective not in COLLECTIVES:
        raise ConfigError(f"expected one of {', '.join(COLLECTIVES)}, got {collective!r}", field="op")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {p}: {getattr(e, 'strerror', None) or e}") from None
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first.replace(" ", "").startswith("size_bytes,"):
        return _read_csv(p, text, collective)
    return _read_text(p, text, collective)


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


def _read_text(p: Path, text: str, collective: str | None) -> NcclTestsResult:
    ranks: dict[int, str] = {}
    rows: list[NcclTestsRow] = []
    avg = None
    saw_header = False
    started = None
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or _NCCL_LOG.search(line):
            continue
        if line.startswith("#"):
            if m := _RANK.match(line):
                rank = int(m.group(1))
                if rank in ranks:
                    raise _refuse(p, line_no, f"rank {rank} is listed twice")
                ranks[rank] = m.group(2)
            elif m := _STARTING.match(line):
                started = _spelled(m.group(1))
            elif m := _AVG.match(line):
                avg = _number(p, line_no, m.group(1), "the average bus bandwidth")
            elif line.startswith("# nThread") or re.match(r"^#\s*size\s+count\s+type", line):
                saw_header = True
            continue
        rows.append(_row(p, line_no, line.split()))
    if not rows:
        what = "no result table" if saw_header else "no nccl-tests output (no '# nThread' line, no result table)"
        raise ConfigError(f"{p}: {what}")
    if ranks and sorted(ranks) != list(range(len(ranks))):
        raise ConfigError(f"{p}: the Rank lines list ranks {sorted(ranks)}, not 0 to {len(ranks) - 1}")
    n = len(ranks) or None
    nodes = len(set(ranks.values())) or None
    op = collective or started or _named(p) or _implied(p, rows, n)
    return NcclTestsResult(str(p), op, n, nodes, tuple(rows), avg)


def _row(p: Path, line_no: int, f: list[str]) -> NcclTestsRow:
    """One table line: 12 fields (no root column) or 13 (with it)."""
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
    t, algbw, busbw = (
        _number(p, line_no, x, name) for x, name in zip(out[:3], ("time", "algbw", "busbw"), strict=True)
    )
    it, ialgbw, ibusbw = (
        _number(p, line_no, x, name) for x, name in zip(inp[:3], ("time", "algbw", "busbw"), strict=True)
    )
    for wrong in (out[3], inp[3]):
        if wrong != "N/A" and _number(p, line_no, wrong, "#wrong") != 0:
            raise _refuse(p, line_no, f"nccl-tests found {wrong} wrong values at this size: the data is not valid")
    return NcclTestsRow(size, count, dtype, redop, root, t, algbw, busbw, it, ialgbw, ibusbw)


def _named(p: Path) -> str | None:
    return _spelled(p.name)


def _spelled(text: str) -> str | None:
    """The collective a name spells (``all_reduce_perf``, ``nccl-all-reduce-p5.csv``), if any."""
    name = text.lower()
    for op, spellings in _FILE_NAMES.items():  # longer names first: reduce_scatter before reduce
        if any(s in name for s in spellings):
            return op
    return None


def _implied(p: Path, rows: list[NcclTestsRow], ranks: int | None) -> str:
    r = max(rows, key=lambda r: r.size_bytes)
    whole = r.count * ELEMENT_BYTES[r.type] == r.size_bytes
    reduces = r.redop != "none"
    if not reduces and r.root is not None and r.root >= 0:
        return "broadcast"
    if reduces and whole and (r.root is None or r.root < 0):
        return "all_reduce"
    if ranks and r.count * ELEMENT_BYTES[r.type] * ranks == r.size_bytes and (r.root is None or r.root < 0):
        return "reduce_scatter" if reduces else "all_gather"
    raise ConfigError(
        f"{p}: cannot tell which collective the table measured; name it in the file name or give it (--op)"
    )


def _read_csv(p: Path, text: str, collective: str | None) -> NcclTestsResult:
    reader = csv.reader(text.splitlines())
    header = [h.strip() for h in next(reader)]
    if tuple(header) != CSV_COLUMNS:
        raise ConfigError(f"expected the columns {','.join(CSV_COLUMNS)}", where=f"{p}:1")
    rows = []
    for line_no, f in enumerate(reader, start=2):
        if not any(x.strip() for x in f):
            continue
        if len(f) != len(CSV_COLUMNS):
            raise _refuse(p, line_no, f"expected {len(CSV_COLUMNS)} values, got {len(f)}")
        size = _number(p, line_no, f[0].strip(), "size_bytes", int)
        if size < 1:
            raise _refuse(p, line_no, "size_bytes below 1")
        vals = [_number(p, line_no, x.strip(), name) for x, name in zip(f[1:], CSV_COLUMNS[1:], strict=True)]
        rows.append(NcclTestsRow(size, None, None, None, None, *vals))
    if not rows:
        raise ConfigError(f"{p}: no rows")
    op = collective or _named(p)
    if op is None:
        raise ConfigError(
            f"{p}: cannot tell which collective the file measured; name it in the file name or give it (--op)"
        )
    return NcclTestsResult(str(p), op, None, None, tuple(rows))
