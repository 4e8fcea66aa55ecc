"""The files of a sweep: its table (CSV and Parquet) and its recommendation (JSON), written
atomically into an output folder checked before any prediction runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardsim.simulator.errors import ConfigError
from shardsim.simulator.files import atomic_path, atomic_write
from shardsim.simulator.sweep.rows import native

if TYPE_CHECKING:
    import pandas as pd


def check_output_dir(out: str | Path) -> Path:
    """Make sure `out` is a writable folder before any prediction runs (ConfigError otherwise)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output folder {out} is a file, not a folder", field="--out")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".shardsim-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write to output folder {out}: {exc.strerror or exc}", field="--out") from None
    return path


def write_tables(df: pd.DataFrame, out: str | Path, stem: str = "sweep") -> list[Path]:
    """All rows to CSV and Parquet."""
    out = Path(out)
    csv, parquet = out / f"{stem}.csv", out / f"{stem}.parquet"
    with atomic_path(csv) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")
    with atomic_path(parquet) as tmp:
        df.to_parquet(tmp, index=False)
    return [csv, parquet]


def write_recommendation(rec: dict[str, Any], out: str | Path, name: str = "recommended.json") -> Path:
    """`recommend()`'s answer as indented JSON."""
    path = Path(out) / name
    atomic_write(path, json.dumps(rec, indent=2) + "\n")
    return path


def to_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (NaN → None, numpy scalars → Python)."""
    return [{k: native(v) for k, v in r.items()} for r in df.to_dict(orient="records")]
