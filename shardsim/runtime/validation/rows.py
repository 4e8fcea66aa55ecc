"""A validation's rows: one per configuration, what its runs measured (every attempt's steps,
the quiet ones kept) and what the simulator predicts for it at the host's speed of the runs."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardsim.config import RunConfig
from shardsim.runtime.records import LabReadings, RunRecord
from shardsim.runtime.validation.matrix import Matrix
from shardsim.simulator.results import KEY_FIELDS, StrategyKey, result_key

if TYPE_CHECKING:
    from shardsim.simulator.predict import StepPrediction
    from shardsim.specs.hardware.topology import Cluster


@dataclass
class Row:
    """One configuration of a validation: what its runs measured and what is predicted for it.
    It starts with the key every result carries (`simulator.results.ResultKey`, docs/results.md; its
    `device` the topology's). Memory is the allocated peak: predicted, and measured as the run
    record's `memory_allocated_gib` (the peak resident set on CPU)."""

    topology: str
    nodes: int
    world: int
    device: str
    workload: str
    strategy: StrategyKey
    label: str
    predicted_s: float = math.nan
    measured_s: float = math.nan
    error_pct: float = math.nan  # (predicted - measured) / measured
    measured_min_s: float = math.nan
    measured_max_s: float = math.nan
    step_times_s: list[float] = field(default_factory=list)
    predicted_compute_s: float = math.nan
    predicted_comm_s: float = math.nan
    predicted_memory_allocated_gib: float = math.nan
    measured_memory_allocated_gib: float = math.nan
    status: str = "pending"  # ok | failed: <why>
    run_id: str = ""
    host_slowdown: float = 1.0  # the host's speed the prediction assumes, over its speed when profiled
    host_slowdown_before: float = math.nan  # the yardstick just before the run / when profiled
    host_slowdown_after: float = math.nan  # ... and just after it (NaN: not timed, the run's probe said its speed)
    host_probe_s: float = math.nan  # runtime.emulation.hostspeed's probe on every rank before every measured step
    host_speed_from: str = ""  # probe: the run's own probe | yardstick: the validation's pooled yardsticks
    host_steal_share: float = math.nan  # the part of the host's cores' time the hypervisor took (hostspeed.Steal)
    steps_kept: int = 0  # measured steps where it took at most the matrix's max_steal (what measured_s is of)
    host_quiet: bool = True  # quiet steps (of every attempt) >= half a run's; else all measured, steal corrected
    attempts: int = 0  # runs of this configuration
    run_ids: list[str] = field(default_factory=list)  # every attempt's run; run_id is the last
    step_steal_share: list[float] = field(default_factory=list)  # per step of every attempt, as step_times_s
    step_probe_s: list[float] = field(default_factory=list)  # the probe before each step (mean over ranks)
    # a model with experts: what its runs' routing was, the busiest expert's tokens over the mean
    # (the records' `expert_imbalance`, the mean over MoE layers and attempts); its prediction
    # assumes it (`moe_imbalance`). NaN for a dense model.
    moe_imbalance: float = math.nan

    @property
    def key(self) -> tuple[str, str]:
        return (self.topology, self.label)


def row_for(cfg: RunConfig, cluster: Cluster) -> Row:
    """The row of `cfg`, on `cluster`, before anything is run or predicted."""
    inst = cluster.instance
    key = result_key(cfg, topology=inst.name, nodes=cluster.nodes, world=cluster.world, device=inst.device.model)
    return Row(**{name: getattr(key, name) for name in KEY_FIELDS})


def add_attempt(row: Row, run: RunRecord) -> None:
    """Append one run's measured steps, and the host's readings in each, to `row` (a run
    without per-step readings gives every step its mean; none at all, NaN)."""
    times = [float(t) for t in run.step_times_s]
    n = len(times)
    lab = run.lab or LabReadings()
    steal = lab.host_steal_share_by_step or [lab.host_steal_share] * n
    probe = lab.host_probe_by_step_s or [lab.host_probe_s or math.nan] * n
    row.step_times_s += times
    row.step_steal_share += [math.nan if v is None else float(v) for v in steal]
    row.step_probe_s += [math.nan if v is None else float(v) for v in probe]
    row.attempts += 1
    row.run_id = run.run_id
    row.run_ids.append(row.run_id)
    mem, had = run.memory_allocated_gib, row.measured_memory_allocated_gib
    row.measured_memory_allocated_gib = mem if math.isnan(had) else max(had, mem)
    if run.expert_imbalance:
        this, before = statistics.fmean(run.expert_imbalance), row.moe_imbalance
        row.moe_imbalance = this if math.isnan(before) else before + (this - before) / row.attempts
    row.status = "ok"


def quiet_steps(steal: list[float], max_steal: float) -> list[int]:
    """Indices of the steps where the hypervisor took at most `max_steal` (no reading: kept)."""
    return [i for i, s in enumerate(steal) if not s > max_steal]


def settle(row: Row, max_steal: float, needed: int) -> None:
    """Set what `row` measured from its steps: the median of its quiet steps, and the probe and
    steal over them, when it has `needed` of them; else over all its steps (`host_quiet` False).
    A row without per-step readings (an older file) keeps what it has."""
    n = len(row.step_times_s)
    if n == 0 or len(row.step_steal_share) != n or len(row.step_probe_s) != n:
        return
    kept = quiet_steps(row.step_steal_share, max_steal)
    row.steps_kept, row.host_quiet = len(kept), len(kept) >= needed
    use = kept if row.host_quiet else list(range(n))
    times = [row.step_times_s[i] for i in use]
    row.measured_s, row.measured_min_s, row.measured_max_s = statistics.median(times), min(times), max(times)

    def mean(values: list[float]) -> float:
        finite = [values[i] for i in use if math.isfinite(values[i])]
        return statistics.fmean(finite) if finite else math.nan

    row.host_probe_s, row.host_steal_share = mean(row.step_probe_s), mean(row.step_steal_share)


def owes_attempt(row: Row, matrix: Matrix) -> bool:
    """Not measured yet, failed, or stolen with attempts left."""
    return row.status != "ok" or (not row.host_quiet and row.attempts < 1 + matrix.retries)


def rescore(row: Row, pred: StepPrediction) -> None:
    """Set what the simulator predicts for `row`, and its error against what was measured."""
    row.predicted_s = pred.step_time_s
    row.predicted_compute_s = pred.breakdown["compute_s"]
    row.predicted_comm_s = pred.breakdown["exposed_comm_s"]
    row.predicted_memory_allocated_gib = pred.memory_allocated_gib
    if row.status == "ok" and row.measured_s > 0:
        row.error_pct = 100 * (row.predicted_s - row.measured_s) / row.measured_s


def pooled_slowdown(rows: list[Row]) -> float:
    """The host's slowdown since profiling that every prediction of a validation assumes: the
    mean of all yardsticks timed around its runs (1.0 when none was).

    Pooled, not per run: a shared host's speed can change within seconds (see
    experiments/validation/README.md), so a yardstick of a few seconds before or after a 30-s
    run says little about that run, while the mean over the whole validation follows a lasting
    drift (a host that slowed by half after profiling)."""
    samples = [x for r in rows for x in (r.host_slowdown_before, r.host_slowdown_after) if math.isfinite(x)]
    return statistics.fmean(samples) if samples else 1.0


def row_slowdown(row: Row, profile_probe_s: float | None, pooled: float) -> tuple[float, str]:
    """(the host's slowdown since profiling that `row`'s prediction assumes, where it comes
    from): its run's own probe over the profile's when both were timed, else `pooled`.

    The probe was timed on every rank before every step of the run, so it saw the states the
    run ran in; the profile states its figures at the speed of its own probe."""
    if profile_probe_s and math.isfinite(row.host_probe_s) and row.host_probe_s > 0:
        return row.host_probe_s / profile_probe_s, "probe"
    return pooled, "yardstick"
