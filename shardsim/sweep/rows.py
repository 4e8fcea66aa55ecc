"""A sweep row: the table's columns, a row made from one prediction, its values as plain Python."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from shardsim.config.schema import RUN_SETTING_AXES
from shardsim.simulator import results
from shardsim.simulator.results import KEY_COLUMNS, TOKEN_COLUMNS, layout_of, result_key

if TYPE_CHECKING:
    import pandas as pd

    from shardsim.simulator.predict import StepPrediction
    from shardsim.sweep.space import Candidate

# Columns of a sweep row, in order (the CSV/Parquet schema; `--json` rows have the same keys,
# with the `strategy_<field>` columns as one `strategy` object): the key every result starts with
# (`simulator.results`, docs/results.md), then the settings and the prediction.
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
        "layout": layout_of(p.world, key.strategy.tp, key.strategy.pp, key.strategy.degree, key.strategy.cp),
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
        "float8": c.cfg.float8,
        "mlm_fraction": c.cfg.mlm_fraction,
        "moe_imbalance": c.cfg.moe_imbalance,
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


def upgrade_table(df: pd.DataFrame) -> pd.DataFrame:
    """A sweep table in today's columns (`simulator.results.upgrade_table`, in this table's order)."""
    return results.upgrade_table(df, columns(True))


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
