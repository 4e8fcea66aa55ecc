"""A sweep row: the table's columns, a row made from one prediction, its values as plain Python."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from shardsim.simulator.workload.load import spec_name

if TYPE_CHECKING:
    from shardsim.simulator.predict import StepPrediction
    from shardsim.simulator.sweep.space import Candidate

# Columns of a sweep row, in order (the CSV/Parquet schema; `--json` rows have the same keys).
COLUMNS = (
    "topology",
    "nodes",
    "world",
    "device",
    "workload",
    "precision",
    "batch_per_device",
    "grad_accum",
    "global_batch",
    "config",
    "strategy",
    "degree",
    "pp",
    "microbatches",
    "schedule",
    "step_time_s",
    "samples_per_s",
    "compute_s",
    "exposed_comm_s",
    "bubble_s",
    "optimizer_s",
    "comm_total_s",
    "tflops_per_device",
    "mfu",
    "memory_per_rank_gib",
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
)
# The settings of a row, after "schedule", when the sweep lists any (`SweepSpace.spans_settings`):
# ZeRO-2 or not (zero/zero2d), checkpointing and its selective option, the dtype gradients are
# reduced in (fp32 where parameters are not sharded), Adam's implementation.
SETTING_COLUMNS = ("reshard_after_forward", "checkpointing", "selective_ac_option", "reduce_dtype", "optimizer_impl")
# Added by `scaling()` when a sweep spans several cluster sizes.
SCALING_COLUMNS = ("scaling_mode", "scaling_base_gpus", "ideal_samples_per_s", "scaling_efficiency")


def columns(spans_settings: bool) -> tuple[str, ...]:
    """The columns of a sweep's table: `COLUMNS`, with `SETTING_COLUMNS` after "schedule" when
    the sweep lists settings."""
    if not spans_settings:
        return COLUMNS
    at = COLUMNS.index("schedule") + 1
    return COLUMNS[:at] + SETTING_COLUMNS + COLUMNS[at:]


def row_of(c: Candidate, p: StepPrediction) -> dict[str, Any]:
    """The row of one prediction: every column of `columns(True)` but the rank."""
    s = c.cfg.strategy
    bd = p.breakdown
    m = p.memory
    price = p.cost_per_hour_usd
    per_million = price / 3600.0 / p.samples_per_s * 1e6 if price is not None and p.samples_per_s > 0 else None
    degree = s.sharded_degree(p.world)
    return {
        "topology": c.cluster.instance.name,
        "nodes": c.cluster.nodes,
        "world": p.world,
        "device": c.cluster.instance.device.model,
        "workload": spec_name(c.cfg.workload),
        "precision": c.cfg.precision,
        "batch_per_device": c.cfg.batch_per_device,
        "grad_accum": c.cfg.grad_accum,
        "global_batch": p.global_batch,
        "config": c.label,
        "strategy": s.kind,
        "degree": degree,
        "pp": s.pp,
        "microbatches": s.microbatches,
        "schedule": s.schedule if s.spec.is_pipeline else None,
        "reshard_after_forward": s.reshard_after_forward if s.spec.fsdp else None,
        "checkpointing": c.cfg.checkpointing,
        "selective_ac_option": c.cfg.selective_ac_option if c.cfg.checkpointing == "selective" else None,
        "reduce_dtype": c.cfg.grad_dtype if degree > 1 else "fp32",
        "optimizer_impl": c.cfg.optimizer_impl,
        "step_time_s": p.step_time_s,
        "samples_per_s": p.samples_per_s,
        "compute_s": bd["compute_s"],
        "exposed_comm_s": bd["exposed_comm_s"],
        "bubble_s": bd["bubble_s"],
        "optimizer_s": bd["optimizer_s"],
        "comm_total_s": bd["comm_total_s"],
        "tflops_per_device": p.tflops_per_device,
        "mfu": p.mfu,
        "memory_per_rank_gib": p.memory_per_rank_gib,
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
        "cost_per_million_samples_usd": per_million,
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
