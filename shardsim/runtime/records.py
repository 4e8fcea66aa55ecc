"""What one real training run measured (`RunRecord`), and its two files.

Rank 0 of a run writes ``<out>/<run_id>.json`` (every field of the record) and appends one
`RunRow` to ``<out>/runs.csv``, each atomically (`simulator.files`); runs.csv is read, added
to and replaced under a lock, so runs sharing a folder never lose each other's rows and a
crash never leaves a torn file; a runs.csv torn otherwise (edited, copied short) is named and
never added to (`read_runs_csv`). Readers take a record back with `load_run`.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import statistics
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_type_hints

from shardsim.config.schema import SAC_OP
from shardsim.core.csvfile import read_table
from shardsim.core.errors import CorruptFile, WriteError
from shardsim.core.files import atomic_write
from shardsim.core.lockfile import locked
from shardsim.simulator.results import KEY_COLUMNS, KEY_FIELDS, StrategyKey, flatten, upgrade_record, upgrade_runs_row

CSV_NAME = "runs.csv"
READ_BACK_BYTES = 64 << 20  # a run record or a validation read back: larger is not one shardsim wrote


@dataclass(frozen=True, kw_only=True)
class LabReadings:
    """What a run on CPU measures of the host it shares (`runtime.emulation.hostspeed`): the
    torch threads of each rank, the host-speed probe on every rank before every measured step,
    and the hypervisor's part of each measured step (`Steal`: the cores' worth of time it ran
    other guests on ours, and that over all the host's cores; each rank's host, mean over
    ranks), with their means. A reading the host cannot give (no /proc/stat) is None."""

    threads_per_rank: int | None = None
    host_probe_s: float | None = None
    host_probe_by_step_s: list[float] | None = None  # mean over ranks
    host_steal_cores_by_step: list[float] | None = None
    host_steal_share_by_step: list[float] | None = None
    host_steal_cores: float | None = None
    host_steal_share: float | None = None


LAB_KEYS = tuple(f.name for f in fields(LabReadings))


def _lab_nested(data: dict[str, Any]) -> dict[str, Any]:
    """A record's object with `LabReadings`' fields, where a file holds them as top-level keys,
    under ``lab`` (none of them set: no ``lab``)."""
    flat = {k: data[k] for k in LAB_KEYS if k in data}
    if not flat or "lab" in data:
        return data
    rest = {k: v for k, v in data.items() if k not in flat}
    return rest | {"lab": flat} if any(v is not None for v in flat.values()) else rest


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One run's measurements, in the JSON file's order. It carries the key every result carries
    (`simulator.results.ResultKey`, docs/results.md: `topology` to `label`; `device` the device that
    ran) and is named as `simulator.predict.StepPrediction`'s fields where they mean the same:
    `config`, `global_batch`, `step_time_s` (here the median step), `samples_per_s`,
    `memory_allocated_gib` and `memory_reserved_gib` (the largest rank's peaks); every other
    field only a measurement has. The per-rank CPU times and the host readings, which older
    files lack, are None there; a file written before the key is read with `simulator.results.upgrade_record`.
    `lab` holds what only a run on CPU measures (`LabReadings`); a GPU run's record has no `lab`
    key. Files that hold those readings as top-level keys load too."""

    source: str = "measured"
    run_id: str
    finished_at: str  # ISO 8601, UTC, to the second
    config: dict[str, Any]  # the resolved configuration (RunConfig.to_dict(); older records: fewer keys)
    topology: str
    nodes: int  # nodes the ranks filled: world / nproc_per_node
    world: int
    device: str  # the CUDA device's name, or cpu
    workload: str
    strategy: StrategyKey
    label: str  # the strategy's label
    nproc_per_node: int
    global_batch: int
    steps: int  # measured steps
    warmup: int  # warm-up steps, not measured
    step_time_s: float  # median of the measured steps
    step_time_min_s: float
    step_time_max_s: float
    step_time_iqr_s: float
    step_time_std_s: float
    step_times_s: list[float]  # every measured step
    warmup_times_s: list[float]
    step_cpu_times_s: list[float]  # rank 0's process CPU time per measured step
    step_cpu_times_by_rank_s: list[list[float]] | None = None  # every rank's, [rank][step]
    lab: LabReadings | None = None  # the emulated CPU lab's readings: CPU runs only
    samples_per_s: float
    # the largest rank's peak: torch.cuda.max_memory_allocated on a GPU, the peak resident set on CPU
    memory_allocated_gib: float
    memory_reserved_gib: float | None  # the largest rank's torch.cuda.max_memory_reserved; None on CPU
    # the largest rank's process total as nvidia-smi shows it (pynvml or nvidia-smi); None on CPU,
    # where neither answers, and in records written before it
    memory_process_gib: float | None = None
    memory_allocated_by_rank_gib: list[float]
    memory_measure: str  # cuda_max_memory_allocated | cpu_peak_rss: what memory_allocated_gib is
    backend: str  # what ran (gloo on CPU whatever the configuration asks)
    # a model with experts: the tokens routed to each expert, [measured step][MoE layer][expert], all
    # ranks summed, and each MoE layer's busiest expert's tokens over the mean (the measured steps');
    # None for a model without experts and in records written before them
    expert_tokens: list[list[list[int]]] | None = None
    expert_imbalance: list[float] | None = None
    losses: list[float]  # the global loss of every step, warm-up included
    loss_first: float
    loss_last: float
    torch_version: str
    hostname: str

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if out["lab"] is None:
            del out["lab"]
        return out

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """The record of a JSON file's object, its fields' types checked; a key it does not
        know, a missing one that every record has, or a value of the wrong type is a ValueError."""
        from pydantic import ValidationError

        from shardsim.core.documents import describe

        data = _lab_nested(upgrade_record(data))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"not a run record: unknown key {unknown[0]!r}")
        try:
            return _record_schema().validate_json(json.dumps(data), strict=True)
        except ValidationError as exc:
            field, words = describe(exc)
            raise ValueError(f"not a run record: field '{field}': {words}") from None


@functools.cache
def _record_schema():
    """RunRecord's fields as a pydantic schema (built once, on first use: pydantic loads only then)."""
    from pydantic import TypeAdapter

    return TypeAdapter(RunRecord)


def step_time_stats(times: list[float]) -> dict[str, float]:
    """Median and spread of the measured (post-warm-up) step times, as RunRecord's fields."""
    if not times:
        raise ValueError("no measured steps")
    s = sorted(times)
    q = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else [s[0], s[0], s[0]]
    return {
        "step_time_s": statistics.median(s),
        "step_time_min_s": s[0],
        "step_time_max_s": s[-1],
        "step_time_iqr_s": q[2] - q[0],
        "step_time_std_s": statistics.stdev(s) if len(s) > 1 else 0.0,
    }


@dataclass(frozen=True)
class RunRow:
    """One run's row of runs.csv: its columns are these fields, in this order (the key's as
    `simulator.results.KEY_COLUMNS`: the strategy as `strategy_<field>` columns)."""

    run_id: str
    finished_at: str
    topology: str
    nodes: int
    world: int
    device: str
    workload: str
    strategy_kind: str
    strategy_degree: int
    strategy_pp: int
    strategy_microbatches: int
    strategy_schedule: str | None
    strategy_reshard_after_forward: bool | None
    strategy_tp: int
    strategy_sequence_parallel: bool
    strategy_async_tp: bool
    strategy_cp: int
    label: str
    batch_per_device: int
    grad_accum: int
    precision: str
    checkpointing: bool | str  # none | full | selective; True (full), False (none) in older records
    selective_ac_option: str | None  # selective checkpointing's: op, or k (every k-th block); None otherwise
    backend: str
    global_batch: int
    steps: int
    warmup: int
    step_time_s: float
    step_time_min_s: float
    step_time_max_s: float
    step_time_iqr_s: float
    step_time_std_s: float
    samples_per_s: float
    memory_allocated_gib: float
    memory_reserved_gib: float | None
    memory_measure: str
    loss_first: float
    loss_last: float
    step_times_s: str  # ';'-separated, 6 significant digits

    @classmethod
    def of(cls, r: RunRecord) -> RunRow:
        cfg = r.config
        key = flatten({name: getattr(r, name) for name in KEY_FIELDS} | {"strategy": asdict(r.strategy)})
        return cls(
            **key,
            **{name: getattr(r, name) for name in _SHARED},
            batch_per_device=cfg["batch_per_device"],
            grad_accum=cfg["grad_accum"],
            precision=cfg["precision"],
            checkpointing=cfg["checkpointing"],
            selective_ac_option=_selective_option(cfg),
            step_times_s=";".join(f"{t:.6g}" for t in r.step_times_s),
        )

    def cells(self) -> dict[str, str]:
        return {k: "" if v is None else str(v) for k, v in asdict(self).items()}


def _selective_option(cfg: dict[str, Any]) -> str | None:
    """The selective option of a configuration's dict (older records leave out the default, op)."""
    if cfg["checkpointing"] != "selective":
        return None
    return str(cfg.get("selective_ac_option", SAC_OP))


CSV_COLUMNS = tuple(f.name for f in fields(RunRow))
# each column's type as runs.csv spells it (checkpointing: none, full or selective; older rows True
# or False); the std column is empty in the rows of a file written before it existed, nodes in
# those of a file written before the result key by a run without the flag
CSV_TYPES = get_type_hints(RunRow) | {
    "checkpointing": bool | Literal["none", "full", "selective"],
    "step_time_std_s": float | None,
    "nodes": int | None,
}
_SHARED = tuple(
    n for n in CSV_COLUMNS if n not in ("step_times_s", *KEY_COLUMNS) and n in RunRecord.__dataclass_fields__
)


def write_run(record: RunRecord, out_dir: str | Path) -> Path:
    """Write ``<out>/<run_id>.json`` and append the record's row to ``<out>/runs.csv`` (columns
    an existing file has beyond `CSV_COLUMNS` are kept; a runs.csv that is a symlink stays one,
    the file it leads to gets the row); returns the JSON path. WriteError when a file cannot be
    written, naming the other: what was written and what not."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{record.run_id}.json"
    try:
        atomic_write(path, record.to_json(indent=2) + "\n")
    except WriteError as exc:
        raise exc.naming((), (f"its row of {CSV_NAME}",)) from None
    try:
        _add_row(record, out)
    except WriteError as exc:
        raise exc.naming((path.name,), ()) from None
    return path


def _add_row(record: RunRecord, out: Path) -> None:
    """Add the row of `record` to `out`/runs.csv (a symlink's target, under its lock)."""
    csv_path = out / CSV_NAME
    shared = Path(os.path.realpath(csv_path))  # a runs.csv linked from several folders has one lock, beside it
    with locked(shared.parent / f".{shared.name}.lock"):  # gone again once the row is in
        rows: list[dict[str, str]] = []
        columns = list(CSV_COLUMNS)
        if csv_path.is_file():  # a device or a FIFO (/dev/null) is written to, never read
            header, rows = read_runs_csv(csv_path)
            columns += [k for k in header if k not in columns]
        rows.append(RunRow.of(record).cells())
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(csv_path, buf.getvalue())


def read_runs_csv(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    """The columns and rows of a runs.csv (OSError when unreadable; CorruptFile naming the file (a folder too),
    the line and the column, with what to do, when it is not one: not text, no run_id column,
    a last line without its line end, a row with more or fewer cells than the header, a cell
    of `RunRow`'s columns that is not of its type; `simulator.csvfile`). A file without a
    column that newer files have (step_time_std_s) is read as it is; `write_run` adds the
    column, empty in its older rows. The rows of a file written before the result key are read
    in today's columns (`simulator.results.upgrade_runs_row`), and `write_run` writes them so."""
    try:
        table = read_table(path, CSV_TYPES, required=("run_id",), error=CorruptFile)
    except IsADirectoryError as exc:
        raise CorruptFile(f"not a runs.csv: {exc.strerror}; move it aside", where=str(path)) from None
    except CorruptFile as exc:
        what = f"{exc.message}; repair or remove that line, or move the file aside (each run appends a row to it)"
        raise CorruptFile(what, where=exc.where, field=exc.field) from None
    rows = []
    for row in table.rows:
        try:
            rows.append(upgrade_runs_row(row.cells, CSV_COLUMNS))
        except (KeyError, ValueError) as exc:  # a row of the older form whose strategy cannot be read
            what = f"not a run's row: its strategy ({exc}); repair or remove that line, or move the file aside"
            raise CorruptFile(what, where=f"{path} line {row.line}") from None
    columns = table.columns
    if rows and rows[0] is not table.rows[0].cells:  # written before the key: read in today's columns
        columns = list(rows[0])
    return columns, rows


def check_runs_csv(folder: str | Path) -> None:
    """Fail (CorruptFile) before a run when the runs.csv its row goes to cannot be read back: a
    torn file, or a folder. A device or FIFO (``/dev/null``) is written through, never read."""
    path = Path(folder) / CSV_NAME
    if path.is_file() or path.is_dir():
        read_runs_csv(path)


def read_back(path: str | Path, what: str) -> str:
    """The text of a JSON file shardsim wrote (a run record, a validation): CorruptFile naming it,
    as not `what`, when it is a folder, larger than `READ_BACK_BYTES` (a device is not read on) or
    not UTF-8; OSError when it cannot be opened."""
    where = str(path)
    if Path(path).is_dir():
        raise CorruptFile(f"not {what}: a folder", where=where)
    with open(path, "rb") as f:
        data = f.read(READ_BACK_BYTES + 1)
    if len(data) > READ_BACK_BYTES:
        raise CorruptFile(f"not {what}: larger than {READ_BACK_BYTES >> 20} MiB", where=where)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptFile(f"not {what}: not UTF-8 text", where=where) from None


def load_run(path: str | Path) -> RunRecord:
    """The record of a run's JSON file (OSError when unreadable; CorruptFile, a ValueError naming
    the file, when it is not a record: torn, not JSON, a field missing, unknown or mistyped)."""
    where = str(path)
    try:
        data = json.loads(read_back(path, "a run record"))
    except json.JSONDecodeError as exc:
        raise CorruptFile(f"not valid JSON (line {exc.lineno}: {exc.msg}; truncated?)", where=where) from None
    if not isinstance(data, dict):
        raise CorruptFile(f"not a run record: a JSON {type(data).__name__}", where=where)
    try:
        return RunRecord.from_dict(data)
    except ValueError as exc:
        raise CorruptFile(str(exc), where=where) from None
