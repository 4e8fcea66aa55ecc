"""A sweep row: the table's columns, a row made from one prediction, its values as plain Python."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from shardsim.config.key import KEY_COLUMNS, result_key
from shardsim.config.schema import RUN_SETTING_AXES
from shardsim.simulator.strategies.kinds import STRATEGIES as KINDS
from shardsim.spec.parallel_dims import ParallelDims

if TYPE_CHECKING:
    import pandas as pd

    from shardsim.simulator.predict import StepPrediction
    from shardsim.simulator.sweep.space import Candidate

# Tokens and dollars (`simulator.economics`), after the rank (added later: a table written before
# them reads with `upgrade_table`): a text model's tokens per sample (else empty) and tokens/s per
# GPU, $ per step and per million tokens (empty without a price or a sequence).
TOKEN_COLUMNS = ("seq_len", "tokens_per_s_per_gpu", "cost_per_step_usd", "cost_per_million_tokens_usd")
# Columns of a sweep row, in order (the CSV/Parquet schema; `--json` rows have the same keys,
# with the `strategy_<field>` columns as one `strategy` object): the key every result starts with
# (`config.key`, docs/results.md), then the settings and the prediction.
COLUMNS = (
    *KEY_COLUMNS,
    "layout",
    "precision",
    "batch_per_device",
    "grad_accum",
    "global_batch",
    "step_time_s",
    "samples_per_s",
    "compute_s",
    "exposed_comm_s",
    "bubble_s",
    "optimizer_s",
    "comm_total_s",
    "tflops_per_device",
    "mfu",
    "memory_allocated_gib",
    "memory_reserved_gib",
    "memory_required_gib",
    "device_memory_gib",
    "mem_params_gib",
    "mem_grads_gib",
    "mem_optimizer_gib",
    "mem_gathered_gib",
    "mem_activations_gib",
    "mem_overhead_gib",
    "mem_step_temporaries_gib",
    "fits",
    "fit_reason",
    "cost_per_hour_usd",
    "cost_per_million_samples_usd",
    "rank",
    *TOKEN_COLUMNS,
)
# The settings of a row, after "global_batch", when the sweep lists any (`SweepSpace.spans_settings`):
# checkpointing and its selective option, the dtype gradients are reduced in (where parameters
# are not sharded, DDP's: fp32 unless a compression hook), Adam's implementation. (ZeRO-2 or not is the key's
# strategy_reshard_after_forward.)
SETTING_COLUMNS = tuple(s.name for s in RUN_SETTING_AXES if s.name not in COLUMNS)  # precision is always a column
# Added after "fit_reason" by a pruned search (`sweep.prune`): "" where the row was simulated, else
# the rule that pruned it ("memory", "compute bound", "chain bound"); then, for a row a bound pruned,
# that lower bound on its step time and the configuration whose simulated rate it could not reach.
PRUNED_COLUMN = "pruned"
PRUNED_COLUMNS = (PRUNED_COLUMN, "bound_step_s", "pruned_by")
# Added by `scaling()` when a sweep spans several cluster sizes.
SCALING_COLUMNS = ("scaling_mode", "scaling_base_gpus", "ideal_samples_per_s", "scaling_efficiency")


def columns(spans_settings: bool) -> tuple[str, ...]:
    """The columns of a sweep's table: `COLUMNS`, with `SETTING_COLUMNS` after "global_batch" when
    the sweep lists settings."""
    if not spans_settings:
        return COLUMNS
    at = COLUMNS.index("global_batch") + 1
    return COLUMNS[:at] + SETTING_COLUMNS + COLUMNS[at:]


def with_pruned(cols: tuple[str, ...]) -> tuple[str, ...]:
    """A pruned search's columns: `cols` with `PRUNED_COLUMNS` after "fit_reason"."""
    at = cols.index("fit_reason") + 1
    return (*cols[:at], *PRUNED_COLUMNS, *cols[at:])


def layout_of(world: int, tp: int, pp: int, shard: int) -> str:
    """The layout as ``tp × pp × dp(shard)``: tensor-parallel degree, pipeline stages, data-parallel
    ranks of a stage and the ranks a parameter is sharded over among them (1: replicated)."""
    return ParallelDims.of_world(world, tp=tp, pp=pp, dp_shard=shard).layout


def row_of(c: Candidate, p: StepPrediction) -> dict[str, Any]:
    """The row of one prediction: every column of `columns(True)` but the rank."""
    bd = p.breakdown
    m = p.memory
    price = p.cost_per_hour_usd
    key = result_key(
        c.cfg, topology=c.cluster.instance.name, nodes=c.cluster.nodes, world=p.world, device=p.device, label=c.label
    )
    return {
        **key.columns(),
        "layout": layout_of(p.world, key.strategy.tp, key.strategy.pp, key.strategy.degree),
        "precision": c.cfg.precision,
        "batch_per_device": c.cfg.batch_per_device,
        "grad_accum": c.cfg.grad_accum,
        "global_batch": p.global_batch,
        "checkpointing": c.cfg.checkpointing,
        "selective_ac_option": c.cfg.selective_ac_option if c.cfg.checkpointing == "selective" else None,
        "reduce_dtype": c.cfg.grad_dtype if key.strategy.degree > 1 else c.cfg.ddp_reduce_dtype,
        "optimizer_impl": c.cfg.optimizer_impl,
        "optimizer": c.cfg.optimizer,
        "attention": c.cfg.attention,
        "compile": c.cfg.compile,
        "mlm_fraction": c.cfg.mlm_fraction,
        "step_time_s": p.step_time_s,
        "samples_per_s": p.samples_per_s,
        "compute_s": bd["compute_s"],
        "exposed_comm_s": bd["exposed_comm_s"],
        "bubble_s": bd["bubble_s"],
        "optimizer_s": bd["optimizer_s"],
        "comm_total_s": bd["comm_total_s"],
        "tflops_per_device": p.tflops_per_device,
        "mfu": p.mfu,
        "memory_allocated_gib": p.memory_allocated_gib,
        "memory_reserved_gib": p.memory_reserved_gib,
        "memory_required_gib": p.memory_required_gib,
        "device_memory_gib": p.device_memory_gib,
        "mem_params_gib": m["params_gib"],
        "mem_grads_gib": m["grads_gib"],
        "mem_optimizer_gib": m["optimizer_gib"],
        "mem_gathered_gib": m["gathered_gib"],
        "mem_activations_gib": m["activations_gib"],
        "mem_overhead_gib": m["overhead_gib"],
        "mem_step_temporaries_gib": m["step_temporaries_gib"],
        "fits": bool(p.fits),
        "fit_reason": p.fit_reason,
        "cost_per_hour_usd": price,
        "cost_per_million_samples_usd": p.cost_per_million_samples_usd,
        "seq_len": p.seq_len,
        "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
        "cost_per_step_usd": p.cost_per_step_usd,
        "cost_per_million_tokens_usd": p.cost_per_million_tokens_usd,
    }


def native(v: Any) -> Any:
    """A table value as plain Python (numpy scalars unwrapped, NaN as None), ready for JSON."""
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item"):
        v = v.item()
        if isinstance(v, float) and math.isnan(v):
            return None
    return v


# a table written before the result key: its columns → today's
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


def _with_tp(df: pd.DataFrame) -> pd.DataFrame:
    """A table with the tensor-parallel columns (`TP_DEFAULTS` where it was written before them),
    after the strategy's other columns."""
    missing = {c: v for c, v in TP_DEFAULTS.items() if c not in df.columns}
    if not missing and ("layout" in df.columns or "label" not in df.columns):
        return df
    out = df.copy()
    at = (
        list(out.columns).index("strategy_reshard_after_forward") + 1
        if "strategy_reshard_after_forward" in out
        else len(out.columns)
    )
    for i, (c, v) in enumerate(missing.items()):
        out.insert(at + i, c, v)
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


def upgrade_table(df: pd.DataFrame) -> pd.DataFrame:
    """A sweep table (sweep.parquet, or sweep.csv as pandas reads it) in today's columns: one
    written before the result key (`config` the label, `strategy` the kind, loose `degree`, ...,
    `memory_per_rank_gib` the required memory) is read as this form states it: ZeRO-2 from the
    label where the table has no reshard_after_forward column, and the allocated and reserved
    peaks from its parts (`simulator.memory.MemoryBreakdown`). Today's tables are returned as they are."""
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
    settings = [c for c in SETTING_COLUMNS if c in out]
    order = list(columns(bool(settings)))
    order = [c for c in order if c in out and (c in settings or c not in SETTING_COLUMNS)]
    return out[order + [c for c in out.columns if c not in order]]
