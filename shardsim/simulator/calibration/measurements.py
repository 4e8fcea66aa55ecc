"""Measured runs to calibrate against, each a checked configuration with what it measured.

Three sources, each row becoming one `Measurement`:
- a CSV of measurements: a workload (``workload``: a library name, a model YAML or config.json;
  or the shape itself: ``family, hidden, layers, heads, kv_heads, ffn, vocab, seq_len,
  tied_embeddings, positions``), any configuration fields (``nodes`` or ``gpus``, ``strategy``,
  ``batch_per_device``, ``grad_accum``, ``precision``, ``checkpointing``, ``reduce_dtype``, ...),
  and the measurement: one or more of `METRICS`, which must agree (`METRIC_AGREEMENT`; the
  runtime's files: their step time). The runtime's ``runs.csv``
  is one (its ``strategy_<field>`` columns, ``kind`` and loose ``degree``, ... in a file written
  before the result key, are the strategy; docs/results.md); so is a pandas DataFrame of those
  columns (`read_frame`). A torn or ragged file is refused (`simulator.csvfile`). llm-foundry's
  benchmark columns are read too
  (`LLM_FOUNDRY`): ``d_model, n_heads, n_layers, expansion_ratio, vocab_size, seq_len, gpus,
  microbatch, grad_accum, activation_checkpointing, sharding_strategy, mp_mode``, an MPT model
  (learned positions, tied embeddings) unless a ``family`` column says otherwise; a
  ``num_params`` column is checked against the model's count (within `PARAMS_TOLERANCE`).
- the runtime's run JSON files (a file, or a folder of them): read by the keys `RunRecord`
  documents (``config``: `RunConfig.to_dict()`, ``world``, ``step_time_s``), without importing
  the runtime (the simulator never does).
The devices a row ran on (``gpus``; runs.csv's and a record's ``world``) and ``gpus_per_node``
set its nodes and its part of each (`placement`: 1, 2 or 4 GPUs of an 8-GPU node run on part of
one; a run's ``nodes`` counts the hosts it ran on, not the topology's). Every row is predicted on
the topology given to `calibrate`, or its own ``topology`` of the same device, without a profile.
A bad row is one ConfigError naming the file's line (or the record) and the column.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from shardsim.config import SETTINGS, RunConfig, build_config, resolve
from shardsim.core.csvfile import read_table
from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import read_text
from shardsim.simulator.predict import StepPrediction
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import InstanceType, load_instance, part_of_node
from shardsim.specs.model.arch import SHAPE_FIELDS
from shardsim.specs.model.describe import ARCH_FIELDS
from shardsim.specs.model.workload import Workload
from shardsim.specs.strategies import FSDP_SHARDING, ZERO2D

METRICS = ("tokens_per_s_per_gpu", "tokens_per_s", "samples_per_s", "step_time_s")
THROUGHPUTS = METRICS[:3]  # a row may give several: they must agree (`METRIC_AGREEMENT`)
# what a measurement may be: a training step of a microsecond to eleven days, a thousandth of a
# token to a billion tokens a second per device, a trillion over the cluster (beyond: other units,
# or not a measurement)
METRIC_BOUNDS = {
    "tokens_per_s_per_gpu": (1e-3, 1e9),
    "tokens_per_s": (1e-3, 1e12),
    "samples_per_s": (1e-6, 1e12),
    "step_time_s": (1e-6, 1e6),
}
METRIC_AGREEMENT = 0.01  # throughputs of one row (as samples/s over the cluster) may differ this much
RUN_JSON_BYTES = 64 << 20  # a run JSON file of `shardsim run` (its record); larger is refused before it is parsed
RANKS = ("gpus", "world")  # columns of the devices a row ran on: they set its nodes
PARAMS_TOLERANCE = 0.01  # a num_params column may differ this much from the model's count
# llm-foundry's benchmark columns → the schema's fields
LLM_FOUNDRY = {
    "d_model": "hidden",
    "n_heads": "heads",
    "n_layers": "layers",
    "vocab_size": "vocab",
    "microbatch": "batch_per_device",
}
# PyTorch FSDP's sharding strategies a benchmark row may name (HYBRID_SHARD: within a node)
SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
# (a row's gpus_per_node is checked against its topology below, not read as part of a node)
KINDS = {s.name: s.kind for s in SETTINGS if s.name != "gpus_per_node"} | {
    "tied_embeddings": bool,
    "family": str,
    "positions": str,
}
# every column a CSV row is read by, and columns of llm-foundry's tables kept as notes: another
# column is a note too, unless it is a near miss of one read (a misspelt column is refused)
READ_COLUMNS = (
    *KINDS,
    "kind",
    *RANKS,
    *METRICS,
    *LLM_FOUNDRY,
    "expansion_ratio",
    "activation_checkpointing",
    "activation_cpu_offload",
    "gpus_per_node",
    "sharding_strategy",
    "mp_mode",
    "num_params",
    "global_batch",
)
HYBRID = "node"  # the degree of a HYBRID_SHARD row until its node's devices are known
NEAR_COLUMN = 0.85  # difflib's ratio above which an unread column is taken as a misspelt read one
NOTE_COLUMNS = ("model", "gpu", "interconnect_gbps_per_node", "mfu_pct", "hfu_pct")


@dataclass(frozen=True)
class Measurement:
    """One measured run: where it came from, its configuration on the calibration's topology,
    its workload and what it measured (`metric`)."""

    label: str
    cfg: RunConfig
    workload: Workload
    nodes: int
    metric: str  # one of METRICS
    measured: float
    info: dict[str, Any] = field(default_factory=dict)  # columns to report the row by
    instance: InstanceType | None = None  # the row's own (its topology, its part of a node); None: the fit's

    @property
    def world(self) -> int:
        """The devices the row ran on (`instance`'s per node × nodes; 0 where it has no instance of its own)."""
        return self.nodes * self.instance.device.count if self.instance else 0

    def ratio(self, pred: StepPrediction) -> float:
        """Predicted over measured throughput (> 1: the model is too fast)."""
        if self.metric == "step_time_s":
            return self.measured / pred.step_time_s
        return samples_per_s(self.metric, self.measured, self.workload, pred.world) ** -1 * pred.samples_per_s


def samples_per_s(metric: str, value: float, w: Workload, world: int) -> float:
    """A throughput metric's value as samples a second over the cluster of `world` devices."""
    if metric == "samples_per_s":
        return value
    tokens = value * world if metric == "tokens_per_s_per_gpu" else value
    return tokens / w.tokens_per_sample


def _cell(text: str, kind: type, where: str, column: str) -> Any:
    if kind is int:
        with contextlib.suppress(ValueError):
            return int(text)  # exactly, however long
        try:
            value = float(text)  # 2.0, 1e3
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value.is_integer()):
            raise ConfigError(f"expected an integer, got {text!r}", where=where, field=column)
        return int(value)
    if kind is bool:
        low = text.strip().lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ConfigError(f"expected true or false, got {text!r}", where=where, field=column)
    if kind is float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"expected a number, got {text!r}", where=where, field=column) from None
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"expected a finite number > 0, got {text!r}", where=where, field=column)
        return value
    return text.strip()


def _llm_foundry(row: dict[str, str], where: str, inst: InstanceType) -> tuple[dict[str, Any], dict[str, str]]:
    """The schema's values of an llm-foundry row, and which column each came from."""
    values: dict[str, Any] = {"family": "mpt", "positions": "learned", "tied_embeddings": True}
    cols: dict[str, str] = {}
    for col, name in LLM_FOUNDRY.items():
        if row.get(col, "").strip():
            values[name], cols[name] = _cell(row[col], int, where, col), col
    if row.get("expansion_ratio", "").strip() and "hidden" in values:
        ffn = _cell(row["expansion_ratio"], float, where, "expansion_ratio") * values["hidden"]
        if not float(ffn).is_integer():
            raise ConfigError(
                f"expansion_ratio × d_model = {ffn:g} is not an integer", where=where, field="expansion_ratio"
            )
        values["ffn"], cols["ffn"] = int(ffn), "expansion_ratio"
    if row.get("activation_checkpointing", "").strip():
        full = _cell(row["activation_checkpointing"], bool, where, "activation_checkpointing")
        values["checkpointing"], cols["checkpointing"] = ("full" if full else "none"), "activation_checkpointing"
    if row.get("activation_cpu_offload", "").strip() and _cell(
        row["activation_cpu_offload"], bool, where, "activation_cpu_offload"
    ):
        raise ConfigError(
            "activations offloaded to the CPU are not modelled", where=where, field="activation_cpu_offload"
        )
    text = row.get("sharding_strategy", "").strip()
    if text:
        if text not in SHARDING:
            raise ConfigError(
                f"expected one of {', '.join(SHARDING)}, got {text!r}", where=where, field="sharding_strategy"
            )
        kind, reshard = FSDP_SHARDING[text]
        values |= {"strategy": kind} | ({} if reshard else {"reshard_after_forward": False})
        if kind == ZERO2D.name:
            values["degree"] = HYBRID
        cols |= {"strategy": "sharding_strategy", "degree": "sharding_strategy"}
    precision = row.get("precision", "").strip().removeprefix("amp_")
    mode = row.get("mp_mode", "").strip()
    if mode == "FULL":
        precision = "fp32"
    if precision:
        values["precision"], cols["precision"] = precision, "precision"
    if mode:  # Composer: PURE reduces in the parameters' dtype, DEFAULT in fp32
        if mode not in ("PURE", "DEFAULT", "FULL"):
            raise ConfigError(f"expected one of PURE, DEFAULT, FULL, got {mode!r}", where=where, field="mp_mode")
        values["reduce_dtype"], cols["reduce_dtype"] = ("fp32" if mode != "PURE" else precision or "bf16"), "mp_mode"
    return values, cols


def _values(row: dict[str, str], where: str, inst: InstanceType) -> tuple[dict[str, Any], dict[str, str]]:
    """The schema's values a CSV row gives (any dialect), and the column each came from."""
    values, cols = _llm_foundry(row, where, inst) if "d_model" in row else ({}, {})
    for col, text in row.items():
        if not text.strip():
            continue
        # runs.csv: the strategy's fields as the result key's `strategy_<field>` columns (`kind`
        # the strategy), or, in a file written before the key, `kind` and loose `degree`, ... with
        # the label under `strategy`
        name = col.removeprefix("strategy_") if col.startswith("strategy_") else col
        name = "strategy" if name == "kind" else name
        if col == "strategy" and "kind" in row:
            continue
        if name in KINDS and name not in cols:
            kind = KINDS[name]
            if name == "checkpointing" and text.strip().lower() in ("true", "false"):
                kind = bool
            values[name], cols[name] = _cell(text, kind, where, col), col
    for col in (*RANKS, "gpus_per_node"):
        if row.get(col, "").strip():
            name = "ranks" if col in RANKS else col
            if name in cols:
                raise ConfigError(f"the devices are given twice: {cols[name]} and {col}", where=where, field=col)
            values[name], cols[name] = _cell(row[col], int, where, col), col
    return values, cols


def placement(
    ranks: int | None, nodes: int | None, per_node: int | None, inst: InstanceType, where: str, cols: dict[str, str]
) -> tuple[int, int]:
    """(nodes, devices used on each) of a row that ran on `ranks` devices (`gpus`, `world`) and / or
    `nodes` nodes, `per_node` of each node's devices (the ``gpus_per_node`` column; None: all
    of `inst`'s). Devices at most one node holds run on one node (1, 2 or 4 GPUs of an 8-GPU
    node: part of it); more fill whole nodes of `per_node`. Errors name the column."""
    per = inst.device.count
    col = cols.get("ranks", "gpus")
    if per_node is not None and not 1 <= per_node <= per:
        why = f"{per_node} GPUs per node; topology {inst.name} has {per}"
        raise ConfigError(why, where=where, field=cols.get("gpus_per_node", "gpus_per_node"))
    per_node = per_node or per
    if ranks is None:
        return nodes or 1, per_node
    if ranks < 1:
        raise ConfigError(f"expected a device count >= 1, got {ranks}", where=where, field=col)
    if ranks <= per_node:
        found = (1, ranks)
    elif ranks % per_node:
        each = f"{per_node} devices each" + (", gpus_per_node" if per_node < per else "")
        what = f"{ranks} devices do not fill whole nodes of {inst.name} ({each})"
        raise ConfigError(what, where=where, field=col)
    else:
        found = (ranks // per_node, per_node)
    if nodes is not None and nodes != found[0] and col != "world":  # runs.csv: nodes are the hosts it ran on
        why = f"{nodes} nodes, but {ranks} devices at {found[1]} a node fill {found[0]}"
        raise ConfigError(why, where=where, field=cols.get("nodes", "nodes"))
    return found


def _measurement(
    values: dict[str, Any],
    cols: dict[str, str],
    where: str,
    topology: str,
    inst: InstanceType,
    metric: dict[str, float],
) -> Measurement:
    """A checked Measurement of schema values; errors name the column a value came from."""
    given = values.get("topology")
    row_inst = inst
    if given is not None and given not in (topology, inst.name, inst.path):
        column = cols.get("topology", "topology")
        try:
            row_inst = load_instance(given)
        except ConfigError as err:
            raise ConfigError(err.message, where=where, field=column) from None
        if row_inst.device.model != inst.device.model:
            theirs = f"{row_inst.device.model}); the fit's figures are {inst.device.model}'s ({topology})"
            why = f"measured on {given} ({theirs}"
            raise ConfigError(why, where=where, field=column)
    nodes, used = placement(
        values.pop("ranks", None), values.get("nodes"), values.pop("gpus_per_node", None), row_inst, where, cols
    )
    if used < row_inst.device.count:
        try:
            row_inst = part_of_node(row_inst, used)
        except ConfigError as err:
            raise ConfigError(err.message, where=where, field=cols.get("ranks", cols.get("gpus_per_node"))) from None
        values["gpus_per_node"] = used
    values["nodes"] = nodes
    if "ranks" in cols:
        cols.setdefault("nodes", cols["ranks"])
    if values.get("degree") == HYBRID:  # HYBRID_SHARD: ZeRO-2D within the node's devices the row ran on
        values["degree"] = row_inst.device.count
    shape = {k: values.pop(k) for k in list(values) if k in ARCH_FIELDS and k not in SHAPE_FIELDS}
    if "family" in shape:  # described by its shape: an inline model
        shape |= {k: values.pop(k) for k in SHAPE_FIELDS if k in values}
        values["workload"] = shape
    elif shape:
        key = next(iter(shape))
        raise ConfigError(
            "applies to a model given by its family (add a family column)", where=where, field=cols.get(key, key)
        )
    values |= {"topology": given or topology, "profile": None, "calibration": None}
    try:
        cfg = build_config(values, where)
        w = load_workload(cfg.workload, cfg.shape, where)
        _, res = resolve(
            cfg,
            cfg.nodes * row_inst.device.count,
            len(w.layers) or len(w.blocks),
            tied_embeddings=w.tied_embeddings,
            arch=w.arch,
            devices_per_node=row_inst.device.count,
        )
    except ConfigError as err:
        name = (err.field or "").removeprefix("workload.")
        raise ConfigError(err.message, where=where, field=cols.get(name, err.field)) from None
    if cfg.precision not in row_inst.device.peak_tflops:
        raise ConfigError(
            f"{inst.device.model} has no {cfg.precision} peak", where=where, field=cols.get("precision", "precision")
        )
    world = cfg.nodes * row_inst.device.count
    info = {"model": w.name, "seq_len": w.tokens_per_sample, "gpus": world, "global_batch": res.global_batch}
    info |= {"microbatch": cfg.batch_per_device, "grad_accum": cfg.grad_accum, "checkpointing": cfg.checkpointing}
    if row_inst is not inst:
        info["topology"] = row_inst.name
    name, value = _agreed(metric, w, world, res.global_batch, where)
    return Measurement(where, cfg, w, int(cfg.nodes), name, value, info, row_inst)


def _agreed(metrics: dict[str, float], w: Workload, world: int, batch: int, where: str) -> tuple[str, float]:
    """The row's measurement: its step time if it gives one (what a run measures), else the first
    of `METRICS` it gives; every other one it gives must say the same, as samples a second over
    the cluster (a step: its global batch `batch` over its time), within `METRIC_AGREEMENT`."""
    first = "step_time_s" if "step_time_s" in metrics else next(iter(metrics))

    def rate(m: str) -> float:
        return batch / metrics[m] if m == "step_time_s" else samples_per_s(m, metrics[m], w, world)

    base = rate(first)
    for m in metrics:
        if abs(rate(m) / base - 1) > METRIC_AGREEMENT:
            why = (
                f"{metrics[m]:g} disagrees with {first} {metrics[first]:g} by {abs(rate(m) / base - 1):.1%} "
                f"(at {world} devices, a global batch of {batch:,} and {w.tokens_per_sample:,} tokens a sample; "
                f"at most {METRIC_AGREEMENT:.0%})"
            )
            raise ConfigError(why, where=where, field=m)
    return first, metrics[first]


def _metric(row: dict[str, Any], where: str) -> dict[str, float]:
    """The row's measurements (each of `METRICS` it gives, in that order), within `METRIC_BOUNDS`;
    of the runtime's (a record, runs.csv: a ``world``), its step time, which its rates are computed from."""
    out: dict[str, float] = {}
    runtime = "world" in row and str(row.get("step_time_s", "")).strip() not in ("", "None")
    for m in ("step_time_s",) if runtime else METRICS:
        text = row.get(m)
        if text is not None and str(text).strip():
            lo, hi = METRIC_BOUNDS[m]
            try:
                value = float(str(text))
            except ValueError:
                value = math.nan
            if not lo <= value <= hi:
                raise ConfigError(f"expected a finite number from {lo:g} to {hi:g}, got {text!r}", where=where, field=m)
            out[m] = value
    if not out:
        raise ConfigError(f"no measurement; expected one of {', '.join(METRICS)}", where=where, field=METRICS[0])
    return out


def _check_columns(columns: list[str], where: str) -> None:
    """Refuse a column that is not read but is a near miss of one that is (and that the header lacks):
    closer than `NEAR_COLUMN` (``micrbatch``, not ``notes`` beside ``nodes``)."""
    missing = [c for c in READ_COLUMNS if c not in columns]
    for col in columns:
        if col not in READ_COLUMNS and col not in NOTE_COLUMNS:
            near = difflib.get_close_matches(col, missing, n=1, cutoff=NEAR_COLUMN)
            if near:
                raise ConfigError(f"unknown column; did you mean {near[0]!r}?", where=where, field=col)


def read_csv(path: Path, topology: str, inst: InstanceType) -> list[Measurement]:
    """Every row of a CSV of measurements (`simulator.csvfile`: a torn or ragged file is refused,
    naming its line); a bad row is a ConfigError naming its line and column."""
    table = read_table(path)
    rows = ((f"{path} line {row.line}", row.cells) for row in table.rows)
    return read_rows(table.columns, rows, f"{path} line 1", topology, inst)


def read_frame(frame: Any, topology: str, inst: InstanceType, name: str = "measurements") -> list[Measurement]:
    """Every row of a pandas DataFrame with a CSV's columns (a cell None or NaN is empty); a bad
    row is a ConfigError naming its index and column."""

    def text(v: Any) -> str:
        return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)

    columns = [str(c) for c in frame.columns]
    records = frame.to_dict(orient="index")
    rows = ((f"{name} row {i}", {str(k): text(v) for k, v in r.items()}) for i, r in records.items())
    return read_rows(columns, rows, f"{name} columns", topology, inst)


def read_rows(
    columns: list[str], rows: Iterable[tuple[str, dict[str, str]]], header: str, topology: str, inst: InstanceType
) -> list[Measurement]:
    """The measurements of rows of text cells, each with where it comes from (a file's line);
    `header` names where the columns come from."""
    out: list[Measurement] = []
    _check_columns(columns, header)
    for where, cells in rows:
        metric = _metric(cells, where)
        values, cols = _values(cells, where, inst)
        if not ({"workload", "family"} & set(values)) and "d_model" not in cells:
            raise ConfigError("no model; expected a workload or a family column", where=where, field="workload")
        m = _measurement(values, cols, where, topology, inst, metric)
        text = cells.get("num_params", "").strip()
        if text:
            counted = _cell(text, int, where, "num_params")
            if abs(m.workload.params / counted - 1) > PARAMS_TOLERANCE:
                why = f"{counted:,} parameters; the model described has {m.workload.params:,}"
                raise ConfigError(why, where=where, field="num_params")
        text = "" if "world" in cells else cells.get("global_batch", "").strip()  # runs.csv: the runtime's own
        if text and _cell(text, int, where, "global_batch") != m.info["global_batch"]:
            why = f"{text} samples; the configuration's global batch is {m.info['global_batch']:,}"
            raise ConfigError(why, where=where, field="global_batch")
        info = {k: cells[k] for k in ("model",) if cells.get(k)}
        out.append(replace(m, info=m.info | info))
    return out


def _flatten(config: dict[str, Any]) -> dict[str, Any]:
    """A run record's `config` (RunConfig.to_dict()) as flat schema values."""
    values = {k: v for k, v in config.items() if k not in ("strategy", "shape")}
    strat = config.get("strategy")
    if isinstance(strat, dict):
        values |= {("strategy" if k == "kind" else k): v for k, v in strat.items()}
    values |= config.get("shape") or {}
    return values


def read_run_json(path: Path, topology: str, inst: InstanceType) -> Measurement:
    where = str(path)
    try:
        data = json.loads(read_text(path, limit=RUN_JSON_BYTES))
    except ValueError as exc:
        raise ConfigError(f"not a readable run record: {exc}", where=where) from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise ConfigError("not a run record (no config mapping)", where=where, field="config")
    metric = _metric(data, where)
    values = _flatten(data["config"])
    world = data.get("world")
    if not isinstance(world, int) or isinstance(world, bool):
        raise ConfigError(f"expected a whole number of ranks, got {world!r}", where=where, field="world")
    values.pop("nodes", None)  # a record's nodes are the hosts it ran on; its world sets the topology's
    values["ranks"] = world
    return _measurement(values, {"ranks": "world"}, where, topology, inst, metric)


def read_measurements(source: str | Path, topology: str, inst: InstanceType) -> list[Measurement]:
    """Every measurement of `source`: a CSV file, a run JSON file, or a folder of run JSON files
    (else its runs.csv)."""
    path = Path(source)
    if path.is_dir():
        runs = sorted(p for p in path.glob("*.json"))
        if runs:
            out = [read_run_json(p, topology, inst) for p in runs]
        elif (path / "runs.csv").is_file():
            out = read_csv(path / "runs.csv", topology, inst)
        else:
            raise ConfigError("no run JSON files and no runs.csv", where=str(path))
    elif path.suffix == ".json":
        out = [read_run_json(path, topology, inst)]
    elif path.is_file():
        out = read_csv(path, topology, inst)
    elif path.exists():
        raise ConfigError("not a file or a folder (a device? a pipe?)", where=str(path))
    else:
        raise ConfigError("no such file or folder", where=str(path))
    if not out:
        raise ConfigError("no measurements", where=str(path))
    return out
