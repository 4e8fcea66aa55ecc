"""What an earlier `validate` left in its folder, read back to resume: the rows of
validation.json, or, when that file is torn or missing while runs/ holds runs, the rows rebuilt
from those runs (runs/*.json: every attempt's steps and host readings). Every run JSON and
runs/runs.csv is checked first, so a torn one is named (exit 2) rather than passed over; a
validation.json that can be neither read nor rebuilt is named too, never read as empty."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from shardsim.config import RunConfig
from shardsim.core.errors import CorruptFile
from shardsim.runtime.records import RunRecord, check_runs_csv, load_run, read_back
from shardsim.runtime.validation.matrix import Matrix
from shardsim.runtime.validation.rows import Row, add_attempt, row_for, settle
from shardsim.simulator.results import upgrade_validation_row
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.load import spec_name

FILE = "validation.json"


def read_rows(path: Path) -> list[Row]:
    """The rows of a validation.json (CorruptFile, naming it, when it cannot be read as one)."""
    from pydantic import TypeAdapter, ValidationError

    from shardsim.core.documents import describe

    where = str(path)
    try:
        doc = json.loads(read_back(path, "a validation"))
    except json.JSONDecodeError as exc:
        raise CorruptFile(f"not valid JSON (line {exc.lineno}: {exc.msg}; truncated?)", where=where) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise CorruptFile("not a validation: no list of rows", where=where)
    base = doc.get("base")
    workload = base.get("workload", RunConfig().workload) if isinstance(base, dict) else RunConfig().workload
    rows = [upgrade_validation_row(r, workload) for r in doc["rows"]]
    try:
        return TypeAdapter(list[Row]).validate_json(json.dumps(rows), strict=True)
    except ValidationError as exc:
        field, words = describe(exc)
        raise CorruptFile(f"not a validation: field 'rows{field}': {words}", where=where) from None


def load_rows(out: Path) -> list[Row]:
    """The rows of `out`'s validation.json: none when it is missing, CorruptFile when torn."""
    path = out / FILE
    return read_rows(path) if path.exists() else []


def read_runs(runs: Path) -> list[RunRecord]:
    """Every run record in `runs` (CorruptFile naming the first that cannot be read back), its
    runs.csv checked too."""
    check_runs_csv(runs)
    return [load_run(p) for p in sorted(runs.glob("*.json"))]


def rebuild_rows(matrix: Matrix, records: list[RunRecord]) -> list[Row]:
    """The rows of `matrix`'s configurations that `records` measured (every attempt, in the
    order they finished), as the runs left them: measured and settled, not yet predicted. A
    record is a configuration's when its topology, strategy, workload and world are; its
    `nodes` is only the flag its run was given (None without one), so it is not compared."""
    rows = []
    ordered = sorted(records, key=lambda r: (r.finished_at, r.run_id))
    for top, cfgs in matrix.topologies:
        cluster = make_cluster(top)
        for cfg in cfgs:
            key = (top, cfg.strategy.label(), spec_name(cfg.workload), cluster.world)
            mine = [r for r in ordered if (r.topology, r.label, r.workload, r.world) == key]
            if not mine:
                continue
            row = row_for(cfg, cluster)
            for record in mine:
                add_attempt(row, record)
            settle(row, matrix.max_steal, matrix.quiet_steps_needed)
            rows.append(row)
    return rows


def _set_aside(path: Path) -> Path:
    """Rename a file that cannot be read to a free name beside it (kept, never overwritten)."""
    n = 0
    while (aside := path.with_name(f"{path.name}.corrupt" + (f".{n}" if n else ""))).exists():
        n += 1
    os.replace(path, aside)
    return aside


def earlier_rows(out: Path, matrix: Matrix, log: Callable[[str], None]) -> list[Row]:
    """The rows an earlier call left in `out`: validation.json's; when it is torn or missing
    and runs/ holds runs, rebuilt from them with a note (the torn file kept beside it as
    validation.json.corrupt); when it is torn and there is nothing to rebuild from,
    CorruptFile naming it."""
    runs = out / "runs"
    records = read_runs(runs)
    path = out / FILE
    if path.exists():
        try:
            return read_rows(path)
        except CorruptFile as exc:
            if not records:
                raise CorruptFile(
                    f"{exc.message}; {runs.name}/ holds no run to rebuild it from (move it aside to start again)",
                    where=str(path),
                ) from None
            why, kept = exc.message, _set_aside(path)
    elif records:
        why, kept = "missing", None
    else:
        return []
    rows = rebuild_rows(matrix, records)
    note = f"; the unreadable file is kept as {kept.name}" if kept else ""
    log(f"{path}: {why}; rebuilt {len(rows)} configuration(s) from the {len(records)} run(s) in {runs}{note}")
    return rows
