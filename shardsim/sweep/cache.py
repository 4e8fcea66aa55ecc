"""Sweep rows cached by configuration: a content hash of everything a prediction depends on → its
row, in SQLite under a cache folder, so that a repeated sweep (one axis added, or resumed after an
interrupt) simulates only the configurations it has not seen.

The key (`KeyMaker.key`) is the SHA-256 of a canonical JSON of: the cache's format, the results'
schema version (`simulator.results.SCHEMA_VERSION`), shardsim's version and a fingerprint of
its code and data files (`code_fingerprint`: any change to the simulator invalidates every row),
the collective algorithm, the resolved configuration
(`RunConfig.to_dict`), the cluster's content (every figure of its instance type and the node
count, not just the topology's name), the workload's content (every block's figures, the
architecture), and the bytes of the calibration and profile files the configuration names. The
row's label is not in the key (it names the settings that differ from a sweep's base, which is
the sweep's, not the configuration's): a cached row takes the asking candidate's label.

Where (`cache_dir`): ``--cache-dir``, else ``$SHARDSIM_CACHE_DIR``, else
``$XDG_CACHE_HOME/shardsim``, else ``~/.cache/shardsim``; the rows are in `FILE` there (delete it
to clear the cache). Concurrent sweeps share it: WAL mode, one connection per process, each
row committed as it is predicted. A folder that cannot be written or a file that is not a
database is one warning, and the sweep runs without the cache. A stored row that is not a sweep
row (`is_row`: any other JSON value, a key missing, a value of the wrong type) is not served: the
configuration is predicted again and its row replaced, and closing the cache warns once with the
count of rows dropped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import fields, is_dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardsim.core.version import version
from shardsim.simulator.results import SCHEMA_VERSION
from shardsim.sweep.rows import COLUMNS, columns

if TYPE_CHECKING:
    from shardsim.specs.model.workload import Workload
    from shardsim.sweep.space import Candidate

log = logging.getLogger("shardsim")

FORMAT = 1  # the key's and the stored row's form; a new one misses every old row
FILE = "sweep-rows.sqlite3"
BUSY_TIMEOUT_S = 30.0  # how long a write waits for another process's (WAL: readers never wait)
LOOKUP_CHUNK = 500  # keys per SELECT (SQLite's host parameters are limited)
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".csv")  # the package's files a prediction may read


def cache_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder: `explicit`, else $SHARDSIM_CACHE_DIR, else $XDG_CACHE_HOME/shardsim, else ~/.cache/shardsim."""
    if explicit:
        return Path(explicit)
    if env := os.environ.get("SHARDSIM_CACHE_DIR"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "shardsim"


PACKAGE = Path(__file__).resolve().parents[1]  # the shardsim package, wherever it is installed


def code_files() -> list[Path]:
    """The package's code and data files (`CODE_SUFFIXES`), sorted: nothing outside it (a
    checkout's tests and experiments, or the site-packages it is installed in)."""
    return sorted(
        p for p in PACKAGE.rglob("*") if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts and p.is_file()
    )


@cache
def code_fingerprint() -> str:
    """SHA-256 of shardsim's own code and data files (paths and bytes): rows predicted by other
    code are never served (a development checkout changes without a version bump)."""
    h = hashlib.sha256()
    for p in code_files():
        h.update(p.relative_to(PACKAGE).as_posix().encode())
        h.update(b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def canonical(obj: Any) -> Any:
    """`obj` as plain JSON values, the same for equal content in any process: dataclasses by
    their compared fields (with the class's name), pydantic models by their JSON dump, mappings
    by key, sets sorted. TypeError for anything else (that configuration is not cached)."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else repr(obj)
    if isinstance(obj, Enum):
        return canonical(obj.value)
    if is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: canonical(getattr(obj, f.name)) for f in fields(obj) if f.compare}
        return {"__class__": type(obj).__qualname__, **out}
    if hasattr(obj, "model_dump") and not isinstance(obj, type):
        return {"__class__": type(obj).__qualname__, **canonical(obj.model_dump(mode="json"))}
    if isinstance(obj, dict):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [canonical(v) for v in obj]
    if isinstance(obj, set | frozenset):
        return sorted((canonical(v) for v in obj), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "item") and callable(obj.item):  # a numpy scalar
        return canonical(obj.item())
    raise TypeError(f"cannot key a {type(obj).__name__}")


def digest(obj: Any) -> str:
    """SHA-256 of `canonical(obj)` as sorted, compact JSON."""
    text = json.dumps(canonical(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _file_digest(path: str | None) -> str | None:
    """SHA-256 of a file's bytes (None for no file; a file that cannot be read keys as its error,
    and the prediction reports it)."""
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


class KeyMaker:
    """The cache keys of one sweep's candidates: the cluster's, the workload's and the files'
    digests are computed once per object (a sweep shares them among its candidates)."""

    def __init__(self, workload: Workload, algo: str) -> None:
        self.common = {
            "format": FORMAT,
            "schema": SCHEMA_VERSION,
            "shardsim": version(),
            "code": code_fingerprint(),
            "algo": algo,
        }
        try:
            self.workload: str | None = digest(workload)
        except TypeError:  # a workload with something uncanonical in it: no row of it is cached
            self.workload = None
        self._clusters: dict[int, tuple[Any, str]] = {}
        self._files: dict[str | None, str | None] = {}

    def _cluster(self, cluster: Any) -> str:
        held = self._clusters.get(id(cluster))
        if held is None or held[0] is not cluster:
            held = self._clusters[id(cluster)] = (cluster, digest(cluster))
        return held[1]

    def _file(self, path: str | None) -> str | None:
        if path not in self._files:
            self._files[path] = _file_digest(path)
        return self._files[path]

    def key(self, c: Candidate) -> str | None:
        """The candidate's key, or None where something in it has no canonical form (not cached)."""
        if self.workload is None:
            return None
        try:
            payload = {
                **self.common,
                "config": canonical(c.cfg.to_dict()),
                "cluster": self._cluster(c.cluster),
                "workload": self.workload,
                "calibration": self._file(c.cfg.calibration),
                "profile": self._file(c.cfg.profile),
            }
        except TypeError:
            return None
        return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def encode_row(row: dict[str, Any]) -> str:
    """A row as JSON: floats as their shortest repr (exact), NaN and infinities as JavaScript's."""
    return json.dumps(row, allow_nan=True, separators=(",", ":"))


# The type of each column a stored row must hold (`rows.row_of`); the other columns of
# `rows.columns(True)` but the rank hold a JSON scalar or nothing.
_TEXT = (
    "topology",
    "device",
    "workload",
    "strategy_kind",
    "label",
    "layout",
    "precision",
    "checkpointing",
    "reduce_dtype",
    "optimizer_impl",
    "optimizer",
    "attention",
    "fit_reason",
)
_COUNTS = (
    "nodes",
    "world",
    "strategy_degree",
    "strategy_pp",
    "strategy_microbatches",
    "strategy_tp",
    "strategy_cp",
    "batch_per_device",
    "grad_accum",
    "global_batch",
)
_FLAGS = ("fits", "strategy_sequence_parallel", "strategy_async_tp", "compile")
_FIGURES = COLUMNS[COLUMNS.index("step_time_s") : COLUMNS.index("mem_step_temporaries_gib") + 1]


def _is(value: Any, column: str) -> bool:
    """Whether `value` has the type `column` holds in a sweep row."""
    if column in _TEXT:
        return isinstance(value, str)
    if column in _FLAGS:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return column not in _COUNTS and column not in _FIGURES
    if column in _COUNTS:
        return isinstance(value, int)
    if column in _FIGURES:
        return isinstance(value, int | float)
    return value is None or isinstance(value, int | float | str)


def is_row(obj: Any) -> bool:
    """Whether `obj` (a decoded stored row) is a sweep row: a mapping with every column of
    `rows.row_of`, each of its type."""
    if not isinstance(obj, dict):
        return False
    return all(c in obj and _is(obj[c], c) for c in columns(True) if c != "rank")


def decode_row(text: str) -> Any:
    """A stored row as JSON values (ValueError where the text is not JSON)."""
    return json.loads(text)


class ResultCache:
    """The store of sweep rows in `folder` (`FILE`), with this process's counts: `hits` (rows
    served) and `simulated` (rows predicted and stored). Unusable (a folder that cannot be made or
    written, a file that is not a database, a write refused): one warning, then it serves and
    stores nothing (`usable` False) and the sweep goes on without it. A stored row that is not a
    sweep row is not served (counted in `dropped`; `close` warns once with the count)."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = cache_dir(folder)
        self.path = self.folder / FILE
        self.hits = 0
        self.simulated = 0
        self.dropped = 0
        self._db: sqlite3.Connection | None = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives a crash of the process
                db.execute("CREATE TABLE IF NOT EXISTS rows (key TEXT PRIMARY KEY, row TEXT NOT NULL) WITHOUT ROWID")
            except BaseException:
                db.close()
                raise
            self._db = db
        except (OSError, sqlite3.Error) as exc:
            self._give_up(exc)

    @property
    def usable(self) -> bool:
        return self._db is not None

    def _give_up(self, exc: BaseException) -> None:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        log.warning("cache %s unusable (%s); sweeping without the cache", self.path, why)
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
        self._db = None

    def lookup(self, keys: Iterable[str | None]) -> dict[str, Any]:
        """The stored rows of `keys` (those found; a row that is not JSON is not found, and counted
        in `dropped`)."""
        wanted = sorted({k for k in keys if k is not None})
        found: dict[str, Any] = {}
        if self._db is None:
            return found
        try:
            for at in range(0, len(wanted), LOOKUP_CHUNK):
                chunk = wanted[at : at + LOOKUP_CHUNK]
                marks = ",".join("?" * len(chunk))
                for key, text in self._db.execute(f"SELECT key, row FROM rows WHERE key IN ({marks})", chunk):
                    try:
                        found[key] = decode_row(text)
                    except (ValueError, TypeError, RecursionError):
                        self.dropped += 1
        except sqlite3.Error as exc:
            self._give_up(exc)
            return {}
        return found

    def store(self, key: str | None, row: dict[str, Any]) -> None:
        """Store one row now (committed: an interrupted sweep keeps it)."""
        if self._db is None or key is None:
            return
        try:
            self._db.execute("INSERT OR REPLACE INTO rows (key, row) VALUES (?, ?)", (key, encode_row(row)))
        except (sqlite3.Error, ValueError, TypeError) as exc:
            self._give_up(exc)

    def count(self) -> int:
        """Rows stored (by every sweep that used this folder)."""
        if self._db is None:
            return 0
        return int(self._db.execute("SELECT count(*) FROM rows").fetchone()[0])

    def close(self) -> None:
        """Close the store; warn once if rows were dropped."""
        if self.dropped:
            log.warning(
                "cache %s: %d stored row(s) were not sweep rows; dropped and predicted again", self.path, self.dropped
            )
            self.dropped = 0
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> ResultCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cached_rows(
    cache: ResultCache, candidates: Sequence[Candidate], workload: Workload, algo: str
) -> tuple[list[str | None], dict[int, dict[str, Any]]]:
    """The candidates' keys, and the rows the cache holds for them by index (each with its
    candidate's label); counted in `cache.hits`. A stored row that is not a sweep row (`is_row`)
    is left out, to be predicted again, and counted in `cache.dropped`."""
    maker = KeyMaker(workload, algo)
    keys = [maker.key(c) for c in candidates]
    found = cache.lookup(keys)
    bad = {key for key, row in found.items() if not is_row(row)}
    cache.dropped += len(bad)
    rows = {
        k: {**found[key], "label": candidates[k].label} for k, key in enumerate(keys) if key in found and key not in bad
    }
    cache.hits += len(rows)
    return keys, rows
