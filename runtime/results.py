"""Measured results: the same field names as a prediction (`step_time_s`, `samples_per_s`,
`memory_per_rank_gib`), plus the raw `step_times_s`. Written by rank 0 only, atomically:
``<out>/<run_id>.json`` (tmp file + os.replace) and a row appended to ``<out>/runs.csv``
(read, add, write a tmp file, os.replace, under a lock), so a crash never leaves a torn file
and results already written stay intact."""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

CSV_NAME = "runs.csv"
CSV_FIELDS = (
    "run_id",
    "finished_at",
    "workload",
    "topology",
    "nodes",
    "strategy",
    "kind",
    "degree",
    "pp",
    "microbatches",
    "schedule",
    "batch_per_device",
    "grad_accum",
    "precision",
    "checkpointing",
    "backend",
    "device",
    "world",
    "global_batch",
    "steps",
    "warmup",
    "step_time_s",
    "step_time_min_s",
    "step_time_max_s",
    "step_time_iqr_s",
    "samples_per_s",
    "memory_per_rank_gib",
    "memory_measure",
    "loss_first",
    "loss_last",
    "step_times_s",
)


def summarize(times: list[float]) -> dict[str, float]:
    """Median and spread of the measured (post-warm-up) step times."""
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


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def csv_row(record: dict[str, Any]) -> dict[str, str]:
    cfg = record.get("config", {})
    strat = cfg.get("strategy", {})
    flat = {**{k: v for k, v in cfg.items() if k != "strategy"}, **record}  # measured values win (backend)
    flat.update({"kind": strat.get("kind"), "degree": strat.get("degree"), "pp": strat.get("pp")})
    flat.update({"microbatches": strat.get("microbatches"), "schedule": strat.get("schedule")})
    flat["step_times_s"] = ";".join(f"{t:.6g}" for t in record.get("step_times_s", []))
    return {k: "" if flat.get(k) is None else str(flat[k]) for k in CSV_FIELDS}


def write_results(record: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``<out>/<run_id>.json`` and append to ``<out>/runs.csv``; returns the JSON path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{record['run_id']}.json"
    _atomic_write(path, json.dumps(record, indent=2) + "\n")
    csv_path = out / CSV_NAME
    with open(out / f".{CSV_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows: list[dict[str, str]] = []
        fields = list(CSV_FIELDS)
        if csv_path.exists():
            with open(csv_path, newline="") as f:
                reader = csv.DictReader(f)
                fields += [k for k in (reader.fieldnames or []) if k not in fields]
                rows = list(reader)
        rows.append(csv_row(record))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
        _atomic_write(csv_path, buf.getvalue())
    return path
