"""The schema every result shares (docs/results.md): its key, its version, and the upgrades that
read files written in its earlier forms as today's.

The key: `predict --json`, a run record and its runs.csv row, a sweep row and a validate row
each start with the same fields: `topology`, `nodes`, `world`, `device`, `workload`, `strategy`
(a `StrategyKey`: one object in JSON, `strategy_<field>` columns in CSV) and `label`, the
strategy's label. `legacy_strategy` reads the spellings of files written before the key (the
kind and its fields as loose columns, the label under `config` or `strategy`).

The upgrades, one an output: `upgrade_prediction` (a prediction's JSON), `upgrade_table` (a
sweep's table), `upgrade_record` (a run record), `upgrade_runs_row` (a runs.csv row) and
`upgrade_validation_row` (a validation's row); each returns today's form as it is.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from shardsim.config.schema import RunConfig
from shardsim.config.strategy import strategy_from_dict
from shardsim.core.errors import ConfigError
from shardsim.simulator.economics import StepEconomics, economics, sequence_length
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.model.load import spec_name
from shardsim.specs.parallel_dims import ParallelDims
from shardsim.specs.strategies import STRATEGIES as KINDS

if TYPE_CHECKING:
    import pandas as pd

    from shardsim.config.strategy import Strategy

# The schema's forms, the newest last; files of every earlier form are read as today's by the
# upgrades below: 1 before the key (the label under `strategy` or `config`, loose strategy
# fields); 2 the key; 3 tensor parallelism (`strategy_tp`, `strategy_sequence_parallel`,
# `strategy_async_tp`, a sweep row's `layout`); 4 tokens and dollars (`TOKEN_COLUMNS`, a
# prediction's peak and MFU formula) and a prediction's process total; 5 context parallelism
# (`strategy_cp`).
SCHEMA_VERSION = 5


@dataclass(frozen=True)
class StrategyKey:
    """A strategy as results name it, resolved on its world: `degree` is the ranks a parameter
    is sharded over (SageMaker's `sharded_data_parallel_degree`): 1 where every rank holds it
    whole (ddp, a pipeline stage not sharded), the world for zero. `pp` and `microbatches` are
    1 and `schedule` null without a pipeline; `reshard_after_forward` is null for kinds that do
    not shard with FSDP2 (false: ZeRO-2). `tp` is the tensor-parallel degree (its ranks share
    a parameter's shard: `degree` counts data-parallel ranks), with `sequence_parallel` and
    `async_tp` (files written before tensor parallelism: 1, false, false). `cp` is the
    context-parallel degree (its ranks share their samples: `degree` counts data-parallel ranks,
    parameters are sharded over degree × cp; files written before it: 1)."""

    kind: str
    degree: int
    pp: int
    microbatches: int
    schedule: str | None
    reshard_after_forward: bool | None
    tp: int = 1
    sequence_parallel: bool = False
    async_tp: bool = False
    cp: int = 1


@dataclass(frozen=True)
class ResultKey:
    """The shared key of every result (docs/results.md). `label` is the strategy's label; a
    sweep that lists settings adds those that differ from its base's ("zero, ckpt off")."""

    topology: str  # the topology's name (its instance type's: a YAML file's `name`)
    nodes: int  # nodes the ranks fill
    world: int  # ranks
    device: str  # the device's name: the topology's model in a prediction, what ran in a run
    workload: str  # the workload's name (a library name, a file's, or an inline model's family)
    strategy: StrategyKey
    label: str  # the configuration's label, as tables name it: its strategy's ("zero2d d=4"; see below)

    def to_dict(self) -> dict[str, Any]:
        """The key as JSON gives it: `strategy` one object (`asdict`'s, without its deep copies: every
        field is a plain value)."""
        d = {name: getattr(self, name) for name in KEY_FIELDS}
        d["strategy"] = {name: getattr(self.strategy, name) for name in STRATEGY_FIELDS}
        return d

    def columns(self) -> dict[str, Any]:
        """The key as CSV gives it: `strategy_<field>` columns in place of the object."""
        return flatten(self.to_dict())


KEY_FIELDS = tuple(f.name for f in fields(ResultKey))
STRATEGY_FIELDS = tuple(f.name for f in fields(StrategyKey))
STRATEGY_COLUMNS = tuple(f"strategy_{f}" for f in STRATEGY_FIELDS)
# the key's columns in a CSV file, in order
KEY_COLUMNS = (*KEY_FIELDS[: KEY_FIELDS.index("strategy")], *STRATEGY_COLUMNS, "label")

# Tokens and dollars (`simulator.economics`), after the rank (added later: a table written before
# them reads with `upgrade_table`): a text model's tokens per sample (else empty) and tokens/s per
# GPU, $ per step and per million tokens (empty without a price or a sequence).
TOKEN_COLUMNS = ("seq_len", "tokens_per_s_per_gpu", "cost_per_step_usd", "cost_per_million_tokens_usd")


def flatten(row: dict[str, Any]) -> dict[str, Any]:
    """A result's dict with its `strategy` object as `strategy_<field>` entries in its place."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k == "strategy" and isinstance(v, dict):
            out |= {f"strategy_{f}": v.get(f) for f in STRATEGY_FIELDS}
        else:
            out[k] = v
    return out


def nest(row: dict[str, Any]) -> dict[str, Any]:
    """A result's flat row (CSV columns) with its `strategy_<field>` entries as one `strategy`
    object, where the first of them stood."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k in STRATEGY_COLUMNS:
            out.setdefault("strategy", {})[k.removeprefix("strategy_")] = v
        else:
            out[k] = v
    return out


def strategy_key(s: Strategy, world: int) -> StrategyKey:
    """The key of strategy `s` on `world` ranks (a field its kind does not carry: its neutral value)."""
    spec = s.spec
    return StrategyKey(
        kind=s.kind,
        degree=s.sharded_degree(world // (s.tp * s.cp)),
        pp=getattr(s, "pp", 1),
        microbatches=getattr(s, "microbatches", 1),
        schedule=getattr(s, "schedule", None) if spec.is_pipeline else None,
        reshard_after_forward=getattr(s, "reshard_after_forward", None) if spec.fsdp else None,
        tp=s.tp,
        sequence_parallel=s.sequence_parallel,
        async_tp=s.async_tp,
        cp=s.cp,
    )


def result_key(
    cfg: RunConfig, *, topology: str, nodes: int, world: int, device: str, label: str | None = None
) -> ResultKey:
    """The key of configuration `cfg` run (or predicted) on `nodes` nodes of `topology`, `world`
    ranks; `label` in place of the strategy's own (a sweep's, naming settings too)."""
    return ResultKey(
        topology=topology,
        nodes=nodes,
        world=world,
        device=device,
        workload=spec_name(cfg.workload),
        strategy=strategy_key(cfg.strategy, world),
        label=cfg.strategy.label() if label is None else label,
    )


def legacy_strategy(
    kind: str, label: str, world: int, degree: Any = None, pp: Any = 1, microbatches: Any = 1, schedule: Any = None
) -> StrategyKey:
    """The key of a strategy as files written before `StrategyKey` spell it: its kind, label and
    world, and its loose fields (a degree None or empty where the kind implies it, a schedule
    given to every kind). ZeRO-2 is read from the label, where it is named. KeyError for a kind
    the registry does not know, ValueError for fields that contradict it."""
    if kind not in KINDS:
        raise KeyError(kind)
    try:
        s = strategy_from_dict(
            {
                "kind": kind,
                "degree": None if degree in (None, "") else int(degree),
                "pp": int(pp or 1),
                "microbatches": int(microbatches or 1),
                "schedule": schedule or "1f1b",
                "reshard_after_forward": "(ZeRO-2)" not in label,
            }
        )
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return strategy_key(s, world)


def layout_of(world: int, tp: int, pp: int, shard: int, cp: int = 1) -> str:
    """The layout as ``tp × pp × dp(shard)``: tensor-parallel degree, pipeline stages, data-parallel
    ranks of a stage and the ranks a parameter is sharded over among them (1: replicated), then
    `` × cp 2`` with context parallelism."""
    return ParallelDims.of_world(world, tp=tp, pp=pp, dp_shard=shard, cp=cp).layout


def upgrade_prediction(d: dict) -> dict:
    """A prediction's JSON object (`predict --json`, a trace's ``otherData.prediction``) in
    today's form: one written before the result key (`strategy` the label, no topology, nodes,
    device or workload: its configuration's and its topology's; `memory_per_rank_gib` the
    required memory, `memory` with its `total_gib` and `reserved_gib`, both with the runtime
    overhead) is read as this form states it, its process total None; one written before the tokens
    and dollars gets them (`_with_economics`), one before context parallelism its `cp` (1).
    Today's are returned as they are."""
    if "label" in d or not isinstance(d.get("strategy"), str):
        if "memory_process_gib" not in d:  # written before the process total was predicted: absent, not zero
            d = d | {"memory_process_gib": None, "memory_process": {}}
        if isinstance(d.get("strategy"), dict) and "cp" not in d["strategy"]:  # written before context parallelism
            d = d | {"strategy": d["strategy"] | {"cp": 1}}
        return _with_economics(d)
    cfg, mem = d["config"], dict(d["memory"])
    s = cfg["strategy"]
    key = legacy_strategy(
        s["kind"], d["strategy"], d["world"], s.get("degree"), s.get("pp"), s.get("microbatches"), s.get("schedule")
    )
    from shardsim.specs.hardware.topology import make_cluster  # numpy: only where an old file is read

    cluster = make_cluster(cfg["topology"], cfg["nodes"])
    overhead = mem["overhead_gib"]
    total, required = mem.pop("total_gib"), mem.pop("reserved_gib")
    out = {
        "topology": cluster.instance.name,
        "nodes": cluster.nodes,
        "world": d["world"],
        "device": cluster.instance.device.model,
        "workload": cfg["workload"] if isinstance(cfg["workload"], str) else cfg["workload"]["family"],
        "strategy": asdict(key),
        "label": d["strategy"],
    }
    for k, v in d.items():
        if k == "memory_per_rank_gib":
            out |= {"memory_allocated_gib": total - overhead, "memory_reserved_gib": required - overhead}
            out["memory_required_gib"] = v
        elif k == "memory":
            out[k] = mem
        elif k not in out:
            out[k] = v
    # the process total (nvidia-smi) was not predicted then: absent, not zero
    return _with_economics(out | {"memory_process_gib": None, "memory_process": {}})


ECONOMICS_FIELDS = ("peak_tflops", "mfu_peak_precision", "mfu_formula", *StepEconomics.__dataclass_fields__)


def _with_economics(d: dict) -> dict:
    """A prediction's JSON object with the fields added with tokens and dollars: where it was
    written before them, its peak from its MFU, its sequence from its configuration's workload
    (None where that no longer loads), the rest from its step, batch and price; its MFU formula
    "" (its MFU counted the backward's attention recomputation too)."""
    if all(k in d for k in ECONOMICS_FIELDS) or "step_time_s" not in d:
        return d
    out = dict(d)
    try:
        cfg = RunConfig.model_validate(d["config"])
        seq = sequence_length(load_workload(cfg.workload, cfg.shape, cfg.source))
    except Exception:  # noqa: BLE001 - a configuration this version no longer reads: no sequence
        seq = None
    step = float("nan") if d["step_time_s"] is None else d["step_time_s"]
    money = economics(step, d["global_batch"], d["world"], seq, d.get("cost_per_hour_usd"))
    peak = d["tflops_per_device"] / d["mfu"] if d.get("mfu") else 0.0
    out.setdefault("peak_tflops", peak)
    out.setdefault("mfu_peak_precision", d.get("config", {}).get("precision", ""))
    out.setdefault("mfu_formula", "")
    for k, v in asdict(money).items():
        out.setdefault(k, v)
    return out


RENAMED = {
    "config": "label",
    "strategy": "strategy_kind",
    "degree": "strategy_degree",
    "pp": "strategy_pp",
    "microbatches": "strategy_microbatches",
    "schedule": "strategy_schedule",
    "reshard_after_forward": "strategy_reshard_after_forward",
    "memory_per_rank_gib": "memory_required_gib",
}


# the strategy's columns a table written before tensor parallelism lacks, with what they were then
TP_DEFAULTS = {"strategy_tp": 1, "strategy_sequence_parallel": False, "strategy_async_tp": False}
# and the column a table written before context parallelism lacks
CP_DEFAULTS = {"strategy_cp": 1}


def _with_tp(df: pd.DataFrame) -> pd.DataFrame:
    """A table with the tensor- and context-parallel columns (`TP_DEFAULTS`, `CP_DEFAULTS` where
    it was written before them), after the strategy's other columns."""
    missing = {c: v for c, v in (TP_DEFAULTS | CP_DEFAULTS).items() if c not in df.columns}
    if not missing and ("layout" in df.columns or "label" not in df.columns):
        return df
    out = df.copy()
    prev = "strategy_reshard_after_forward"
    for c, v in (TP_DEFAULTS | CP_DEFAULTS).items():  # each after the one before it
        if c in missing:
            out.insert(list(out.columns).index(prev) + 1 if prev in out else len(out.columns), c, v)
        prev = c
    if "layout" not in out.columns and "label" in out.columns:
        cells = zip(out["world"], out["strategy_tp"], out["strategy_pp"], out["strategy_degree"], strict=True)
        out.insert(list(out.columns).index("label") + 1, "layout", [layout_of(*map(int, c)) for c in cells])
    return out


def _with_tokens(df: pd.DataFrame) -> pd.DataFrame:
    """A table with `TOKEN_COLUMNS` at its end: where it was written before them, $ per step from
    its price and step time, the sequence (which it does not name) and what needs it empty."""
    if all(c in df.columns for c in TOKEN_COLUMNS) or "step_time_s" not in df.columns:
        return df
    out = df.copy()
    if "seq_len" not in out:
        out["seq_len"] = None
    if "tokens_per_s_per_gpu" not in out:
        out["tokens_per_s_per_gpu"] = float("nan")
    if "cost_per_step_usd" not in out:
        price = out["cost_per_hour_usd"] if "cost_per_hour_usd" in out else float("nan")
        out["cost_per_step_usd"] = price * out["step_time_s"] / 3600.0
    if "cost_per_million_tokens_usd" not in out:
        out["cost_per_million_tokens_usd"] = float("nan")
    return out


def upgrade_table(df: pd.DataFrame, order: tuple[str, ...]) -> pd.DataFrame:
    """A sweep table (sweep.parquet, or sweep.csv as pandas reads it) in today's columns: one
    written before the result key (`config` the label, `strategy` the kind, loose `degree`, ...,
    `memory_per_rank_gib` the required memory) is read as this form states it: ZeRO-2 from the
    label where the table has no reshard_after_forward column, and the allocated and reserved
    peaks from its parts (`simulator.memory.MemoryBreakdown`), its columns in `order` (the sweep's,
    every setting column included: `sweep.rows.columns(True)`), those it has. Today's tables are
    returned as they are."""
    if "label" in df.columns or "config" not in df.columns:
        return _with_tokens(_with_tp(df))
    out = _with_tokens(_with_tp(df.rename(columns=RENAMED)))
    if "strategy_reshard_after_forward" not in out:
        fsdp = out["strategy_kind"].map(lambda k: KINDS[k].fsdp)
        zero3 = ~out["label"].str.contains("(ZeRO-2)", regex=False)
        out["strategy_reshard_after_forward"] = [z if f else None for f, z in zip(fsdp, zero3, strict=True)]
    states = out["mem_params_gib"] + out["mem_grads_gib"] + out["mem_optimizer_gib"] + out["mem_overhead_gib"]
    peak = (out["mem_gathered_gib"] + out["mem_activations_gib"]).where(
        out["mem_gathered_gib"] + out["mem_activations_gib"] >= out["mem_step_temporaries_gib"],
        out["mem_step_temporaries_gib"],
    )
    out["memory_allocated_gib"] = states + peak - out["mem_overhead_gib"]
    out["memory_reserved_gib"] = out["memory_required_gib"] - out["mem_overhead_gib"]
    ordered = [c for c in order if c in out]
    return out[ordered + [c for c in out.columns if c not in ordered]]


def upgrade_record(data: dict[str, Any]) -> dict[str, Any]:
    """A record's JSON object in the current form: a file written before the result key (its
    `strategy` the label, `nodes` None without the flag, `memory_per_rank_gib` and
    `memory_by_rank_gib` the allocated peaks, no reserved one) is read as this form states it;
    one written before context parallelism gets its `cp` (1); anything else is returned as it is."""
    if not isinstance(data.get("strategy"), str) or "label" in data:
        s = data.get("strategy")
        return data | {"strategy": s | {"cp": 1}} if isinstance(s, dict) and "cp" not in s else data
    old = dict(data)
    try:
        label, world, s = old.pop("strategy"), old["world"], old["config"]["strategy"]
        key = legacy_strategy(
            s["kind"], label, world, s.get("degree"), s.get("pp"), s.get("microbatches"), s.get("schedule")
        )
        nodes = old["nodes"] if old.get("nodes") is not None else world // old["nproc_per_node"]
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return data  # not a record of either form: named by the checks that follow
    out: dict[str, Any] = {}
    for k, v in old.items():
        if k in ("nodes", "world", "device", "workload"):  # placed with the key, after topology
            continue
        if k == "memory_per_rank_gib":
            out |= {"memory_allocated_gib": v, "memory_reserved_gib": None}
        elif k == "memory_by_rank_gib":
            out["memory_allocated_by_rank_gib"] = v
        else:
            out[k] = v
        if k == "topology":
            out |= {"nodes": nodes, "world": world, "device": old.get("device"), "workload": old.get("workload")}
            out |= {"strategy": asdict(key), "label": label}
    return out


# the columns of a runs.csv written before the result key, in place of the key's
_LEGACY_COLUMNS = ("strategy", "kind", "degree", "pp", "microbatches", "schedule", "memory_per_rank_gib")


def upgrade_runs_row(cells: dict[str, str], order: tuple[str, ...]) -> dict[str, str]:
    """A runs.csv row's cells in the current columns: a row written before the result key (the
    label under `strategy`, the kind under `kind`, `degree` empty for ddp and zero, `nodes` empty
    without the flag, the allocated peak as `memory_per_rank_gib`) as this form states it, its
    columns in `order` (runs.csv's: `runtime.records.CSV_COLUMNS`), those it has, then the rest."""
    if "kind" not in cells or "label" in cells:
        return cells
    world = int(cells["world"])
    key = legacy_strategy(
        cells["kind"], cells["strategy"], world, cells["degree"], cells["pp"], cells["microbatches"], cells["schedule"]
    )
    nodes = cells["nodes"] or (str(world // int(cells["nproc_per_node"])) if cells.get("nproc_per_node") else "")
    new = {k: v for k, v in cells.items() if k not in _LEGACY_COLUMNS}
    new |= {f"strategy_{k}": "" if v is None else str(v) for k, v in asdict(key).items()}
    new |= {"nodes": nodes, "label": cells["strategy"], "memory_allocated_gib": cells["memory_per_rank_gib"]}
    new.setdefault("memory_reserved_gib", "")
    return {c: new.pop(c) for c in order if c in new} | new


def upgrade_validation_row(row: Any, workload: str) -> Any:
    """A validation.json row in the current form: a row written before the result key (the label
    under `config`, the kind under `strategy` and its fields loose, no nodes, device or workload:
    the topology's, and `workload` the validation's base's; memory as `predicted_memory_gib`, the
    prediction's required memory, and `measured_memory_gib`, the run's allocated peak) as this
    form states it. On a CPU the required memory is the allocated peak (no allocator reserve, no
    runtime overhead); on a GPU the allocated peak is not in such a row (NaN until rescored).
    Anything else is returned as it is."""
    if not isinstance(row, dict) or "config" not in row or "label" in row:
        return row
    old = dict(row)
    try:
        label, kind, world = old.pop("config"), old.pop("strategy"), old["world"]
        loose = [old.pop(k, None) for k in ("degree", "pp", "microbatches", "schedule")]
        key = legacy_strategy(kind, label, world, *loose)
        from shardsim.specs.hardware.topology import make_cluster  # numpy: only where an old file is read

        cluster = make_cluster(old["topology"])
    except (KeyError, TypeError, ValueError, ConfigError):
        return row  # not a row of either form: named by the checks that follow
    out: dict[str, Any] = {}
    for k, v in old.items():
        if k == "predicted_memory_gib":
            out["predicted_memory_allocated_gib"] = v if cluster.instance.device.kind != "gpu" else math.nan
        elif k == "measured_memory_gib":
            out["measured_memory_allocated_gib"] = v
        elif k != "world":
            out[k] = v
        if k == "topology":
            out |= {"nodes": cluster.nodes, "world": world, "device": cluster.instance.device.model}
            out |= {"workload": workload, "strategy": asdict(key), "label": label}
    return out
