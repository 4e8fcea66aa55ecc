"""The validation loop: run what a matrix's rows owe in their emulated clusters (stolen ones
again after the others), predict every row at the host's speed of its runs, and write the
files after each run."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardsim.config import RunConfig
from shardsim.core.units import format_seconds
from shardsim.runtime.records import RunRecord, load_run
from shardsim.runtime.validation.matrix import Matrix
from shardsim.runtime.validation.profiling import ensure_profile, host_slowdown
from shardsim.runtime.validation.report import save, summarize
from shardsim.runtime.validation.resume import earlier_rows
from shardsim.runtime.validation.rows import (
    Row,
    add_attempt,
    owes_attempt,
    pooled_slowdown,
    rescore,
    row_for,
    row_slowdown,
    settle,
)
from shardsim.specs.hardware.topology import make_cluster

_log = logging.getLogger("shardsim")

if TYPE_CHECKING:
    from shardsim.simulator.hardware.profile import Profile

# a yardstick reading younger than this stands for "now" (one takes seconds: two rounds of passes)
READING_FRESH_S = 5.0
RETRY_PAUSE_S = 30.0  # before another round of a topology's stolen configurations: the hypervisor's turns last minutes


def run_config(cfg: RunConfig, matrix: Matrix, cluster, runs: Path, threads: int) -> tuple[RunRecord | None, str]:
    """Run `cfg` for real in the emulated cluster (which is up). Returns (its record, error)."""
    from shardsim.runtime.launch import launch
    from shardsim.runtime.plan import plan_run, run_flags
    from shardsim.runtime.train import default_run_id

    plan = plan_run(cfg, None, emulate=True)
    run_id = default_run_id(plan.resolved_cfg)
    args = run_flags(matrix.steps, matrix.warmup, runs, matrix.timeout, threads, 0, run_id)
    result = launch(
        plan.nproc, args, timeout_s=matrix.timeout, threads=threads, stdout=sys.stderr, cluster=cluster, config=plan.cfg
    )
    if not result.ok:
        return None, result.message
    try:
        return load_run(runs / f"{run_id}.json"), ""
    except (OSError, ValueError) as exc:
        return None, f"the run finished but its result is unreadable: {exc}"


def _after_note(slowdown: float) -> str:
    return f", x{1 / slowdown:.2f} after" if math.isfinite(slowdown) else ""


def _steal_note(share: float) -> str:
    return f"; the hypervisor took {100 * share:.0f} % of the cores' time" if math.isfinite(share) else ""


@dataclass
class _Validation:
    """One call's rows (in the order of `configs`) and what measuring and predicting them needs."""

    matrix: Matrix
    out: Path
    runs: Path
    threads: int
    log: Callable[[str], None]
    profile: Profile
    configs: list[RunConfig]
    rows: list[Row]
    yard_batch: int  # the microbatch size the profile's yardstick was timed at
    calibration: str | None = None  # a calibration file predictions apply over the topology's figures
    # the last yardstick's reading (slowdown, when): the next row's "before" when read just now
    last_reading: tuple[float, float] | None = None

    def rescore(self, i: int, pooled: float) -> None:
        """Predict row `i` at its host speed: its run's probe, else the pooled yardsticks."""
        from shardsim.simulator.predict import predict

        row = self.rows[i]
        row.host_slowdown, row.host_speed_from = row_slowdown(row, self.profile.probe_s, pooled)
        among = row.host_speed_from == "probe"  # read among the ranks: their cache sharing included
        steal = row.host_steal_share if math.isfinite(row.host_steal_share) else None
        slowed = self.profile.slowed(row.host_slowdown, among_ranks=among, steal_share=steal)
        cfg = self.configs[i] if self.calibration is None else self.configs[i].replace(calibration=self.calibration)
        if math.isfinite(row.moe_imbalance):  # the routing its runs had, not the configuration's ideal
            cfg = cfg.replace(moe_imbalance=row.moe_imbalance)
        rescore(row, predict(cfg, profile=slowed))

    def rescore_all(self) -> None:
        pooled = pooled_slowdown(self.rows)
        for i in range(len(self.rows)):
            self.rescore(i, pooled)

    def host_slowdown_now(self, fresh: bool = False) -> float:
        """The host's slowdown now by the profile's yardstick; the last reading when it was taken
        less than `READING_FRESH_S` ago (the previous row's "after" is the next one's "before":
        nothing but a prediction and the files' writing comes between them) unless `fresh`."""
        now = time.monotonic()
        if not fresh and self.last_reading is not None and now - self.last_reading[1] < READING_FRESH_S:
            return self.last_reading[0]
        slowdown = host_slowdown(self.profile, self.yard_batch)
        self.last_reading = (slowdown, time.monotonic())
        return slowdown

    def attempt(self, i: int, cfg: RunConfig, cluster, tag: str) -> None:
        """Run row `i` once more, add what it measured, re-predict it and write the files."""
        r = self.rows[i]
        speed = ""
        if self.profile.probe_s is None:  # no probe to compare a run's with: the yardsticks are its speed
            r.host_slowdown_before = self.host_slowdown_now()
            speed = f" (host speed x{1 / r.host_slowdown_before:.2f})"
        self.log(f"{tag} {cfg.topology} {r.label}: running{speed} ...")
        record, err = run_config(cfg, self.matrix, cluster, self.runs, self.threads)
        if self.profile.probe_s is None or (record is not None and not (record.lab and record.lab.host_probe_s)):
            r.host_slowdown_after = self.host_slowdown_now(fresh=True)  # only a yardstick can say this run's speed
        if record is None:
            if r.attempts == 0:
                r.status = f"failed: {err}"
            self.log(f"{tag} {cfg.topology} {r.label}: FAILED: {err}")
        else:
            add_attempt(r, record)
            settle(r, self.matrix.max_steal, self.matrix.quiet_steps_needed)
            self.rescore(i, pooled_slowdown(self.rows))  # the pool so far; every row is rescored at the end
            quiet = f"{r.steps_kept} of {len(r.step_times_s)} steps quiet" + ("" if r.host_quiet else ", too few")
            self.log(
                f"{tag} {cfg.topology} {r.label}: measured {format_seconds(r.measured_s)} ({quiet}), "
                f"predicted {format_seconds(r.predicted_s)} ({r.error_pct:+.1f} %; host speed x"
                f"{1 / r.host_slowdown:.2f} by its {r.host_speed_from}{_after_note(r.host_slowdown_after)}"
                f"{_steal_note(r.host_steal_share)})"
            )
        save(self.out, self.matrix, self.rows, summarize(self.rows))


def validate(
    matrix: Matrix,
    out: Path,
    *,
    profile: str | None = None,
    threads: int = 1,
    calibration: str | None = None,
    log: Callable[[str], None] = _log.info,
) -> tuple[list[Row], dict[str, Any]]:
    """Run what is missing, predict everything, write the table and plots; returns (rows, summary)."""
    from shardsim.runtime.emulation.iproute import check_privileges
    from shardsim.runtime.emulation.namespaces import emulated
    from shardsim.runtime.emulation.plan import plan_cluster
    from shardsim.simulator.hardware.profile import load_profile

    out.mkdir(parents=True, exist_ok=True)
    runs = out / "runs"
    runs.mkdir(exist_ok=True)
    earlier = {r.key: r for r in earlier_rows(out, matrix, log) if r.status == "ok"}  # checked before any work
    if calibration is not None:
        from shardsim.simulator.calibration.apply import load_calibration

        load_calibration(calibration)  # a bad file fails here, not after the profile is measured
    prof = ensure_profile(matrix, out, profile, log)
    rows: list[Row] = []
    for top, cfgs in matrix.topologies:
        cluster = make_cluster(top)
        for cfg in cfgs:
            rows.append(earlier.get((top, cfg.strategy.label())) or row_for(cfg, cluster))
    v = _Validation(
        matrix,
        out,
        runs,
        threads,
        log,
        profile=load_profile(prof, matrix.base.get("workload", RunConfig().workload)),
        configs=matrix.configs,
        rows=rows,
        yard_batch=max(matrix.microbatch_sizes()),
        calibration=calibration,
    )
    for r in rows:
        settle(r, matrix.max_steal, matrix.quiet_steps_needed)  # the bound may differ from the earlier call's
    v.rescore_all()
    todo = [(i, c) for i, c in enumerate(matrix.configs) if owes_attempt(rows[i], matrix)]
    if todo:
        check_privileges()
    log(
        f"validate: {len(rows)} configurations, {len(rows) - len(todo)} measured, {len(todo)} to run; "
        f"steps where the hypervisor takes more than {100 * matrix.max_steal:g} % of the cores are set aside"
    )
    done = 0
    for top, _ in matrix.topologies:
        pending = [(i, c) for i, c in todo if c.topology == top]
        if not pending:
            continue
        cluster = plan_cluster(top)
        with emulated(cluster):
            for i, cfg in pending:
                if rows[i].status != "ok":  # a stolen row of an earlier call waits for the retries
                    done += 1
                    v.attempt(i, cfg, cluster, f"[{done}/{len(todo)}]")
            for again in range(1, matrix.retries + 1):
                pending = [(i, c) for i, c in pending if rows[i].status == "ok" and owes_attempt(rows[i], matrix)]
                if not pending:
                    break
                names = ", ".join(rows[i].label for i, _ in pending)
                log(f"{top}: too few quiet steps in {names}; again in {RETRY_PAUSE_S:g} s ({again}/{matrix.retries})")
                time.sleep(RETRY_PAUSE_S)
                for i, cfg in pending:
                    v.attempt(i, cfg, cluster, f"[retry {again}]")
    if todo:
        v.rescore_all()  # with the yardsticks of every run
    summary = summarize(rows)
    save(out, matrix, rows, summary)
    if summary["rows_ok"]:
        from shardsim.runtime.validation.plots import plot_validation

        plot_validation(rows, summary, out)
    return rows, summary
