"""Quiet steps: `validate` measures a configuration in the steps where the hypervisor left the
host's cores to it, runs it again later when too few were, and says so when none came; the
profile's core-sharing rounds do the same."""

from __future__ import annotations

import math
import os

import pytest

from shardsim.core.errors import ConfigError
from shardsim.runtime import validation
from shardsim.runtime.emulation.hostspeed import Steal
from shardsim.runtime.profile import cores
from shardsim.runtime.validation import Row, measure, settle
from tests.helpers import run_record
from tests.unit.test_validation import _profile, no_namespaces, run_cli, write

NAN = math.nan


def _row(times, steal, probe) -> Row:
    return Row("emu-2x2", "ddp", "ddp", 1, 1, 1, "1f1b", 4, status="ok", step_times_s=list(times),
               step_steal_share=list(steal), step_probe_s=list(probe), attempts=1)  # fmt: skip


def test_a_row_is_measured_over_its_quiet_steps():
    r = _row([1.0, 2.0, 1.1, 1.2, 1.3], [0.02, 0.30, NAN, 0.05, 0.5], [0.010, 0.020, 0.011, 0.012, 0.030])
    settle(r, max_steal=0.1, needed=3)
    assert (r.steps_kept, r.host_quiet) == (3, True)  # no reading (NaN) is kept
    assert (r.measured_s, r.measured_min_s, r.measured_max_s) == (1.1, 1.0, 1.2)
    assert r.host_probe_s == pytest.approx(0.011) and r.host_steal_share == pytest.approx(0.035)

    settle(r, max_steal=0.1, needed=4)  # too few quiet steps: every step, and its steal
    assert (r.steps_kept, r.host_quiet) == (3, False)
    assert r.measured_s == 1.2 and r.measured_max_s == 2.0
    assert r.host_steal_share == pytest.approx((0.02 + 0.30 + 0.05 + 0.5) / 4)

    settle(r, max_steal=0.6, needed=4)  # a looser bound keeps them all
    assert (r.steps_kept, r.host_quiet, r.measured_s) == (5, True, 1.2)


def test_a_row_of_an_older_file_keeps_what_it_measured():
    r = Row("emu-2x2", "ddp", "ddp", 1, 1, 1, "1f1b", 4, measured_s=1.5, status="ok", step_times_s=[1.4, 1.5, 1.6],
            host_steal_share=0.2)  # fmt: skip
    settle(r, max_steal=0.1, needed=2)
    assert (r.measured_s, r.host_steal_share, r.host_quiet) == (1.5, 0.2, True)


@pytest.fixture
def stolen_runs(monkeypatch):
    """Fake runs: each label's attempts return the given per-step steal shares, in turn."""
    no_namespaces(monkeypatch)
    monkeypatch.setattr(measure, "RETRY_PAUSE_S", 0.0)
    calls: list[str] = []
    plan: dict[str, list[tuple[float, float]]] = {}  # label -> per attempt (step time, steal share)

    def fake_measure(cfg, matrix, cluster, runs, threads):
        label = cfg.strategy.label()
        calls.append(label)
        t, s = plan[label][min(calls.count(label), len(plan[label])) - 1]
        return run_record(run_id=f"{label}-{calls.count(label)}", step_time_s=t, step_times_s=[t] * 4,
                          host_steal_share_by_step=[s] * 4, host_probe_by_step_s=[0.01] * 4), ""  # fmt: skip

    monkeypatch.setattr(measure, "run_config", fake_measure)
    return calls, plan


def test_a_stolen_configuration_is_run_again_after_the_others(tmp_path, stolen_runs, capsys):
    calls, plan = stolen_runs
    plan["ddp"] = [(2.0, 0.3), (1.0, 0.02)]  # stolen, then quiet
    plan["zero"] = [(3.0, 0.4)]  # stolen every time
    plan["zero2d d=2"] = [(1.5, 0.0)]
    text = "workload: small-gpt\ncheckpointing: false\ntopologies: {emu-2x2: [ddp, zero, zero2d]}\n"
    m = write(tmp_path, "m.yaml", text)
    out, prof = tmp_path / "out", str(_profile(tmp_path))
    assert run_cli(["validate", "--matrix", str(m), "--out", str(out), "--profile", prof]) == 0
    assert calls == ["ddp", "zero", "zero2d d=2", "ddp", "zero", "zero"]  # 1 + 2 retries at most
    cap = capsys.readouterr()
    assert "too few quiet steps in ddp, zero; again in 0 s (1/2)" in cap.err
    rows = {r.config: r for r in validation.load_rows(out)}
    ddp, zero = rows["ddp"], rows["zero"]
    assert (ddp.attempts, ddp.steps_kept, ddp.host_quiet, ddp.measured_s) == (2, 4, True, 1.0)
    assert ddp.run_ids == ["ddp-1", "ddp-2"] and len(ddp.step_times_s) == 8
    assert ddp.host_steal_share == pytest.approx(0.02)
    assert (zero.attempts, zero.steps_kept, zero.host_quiet, zero.measured_s) == (3, 0, False, 3.0)
    assert zero.host_steal_share == pytest.approx(0.4)  # predicted with it taken off the cores
    assert "| 0 of 12 † |" in cap.out and "1 of them †" in cap.out
    assert validation.summarize(list(rows.values()))["rows_stolen"] == 1

    calls.clear()  # resumed: nothing is owed
    assert run_cli(["validate", "--matrix", str(m), "--out", str(out), "--profile", prof]) == 0
    assert calls == []
    plan["zero"] = [(2.5, 0.01)]  # more retries allowed: the stolen one is tried again, and is quiet
    assert run_cli(["validate", "--matrix", str(m), "--out", str(out), "--profile", prof, "--retries", "3"]) == 0
    assert calls == ["zero"]
    zero = {r.config: r for r in validation.load_rows(out)}["zero"]
    assert (zero.attempts, zero.steps_kept, zero.host_quiet, zero.measured_s) == (4, 4, True, 2.5)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("max_steal: 0\n", "field 'max_steal': expected a part of the cores' time, 0 < max_steal <= 1, got 0"),
        ("max_steal: 1.5\n", "0 < max_steal <= 1, got 1.5"),
        ("max_steal: lots\n", "got 'lots'"),
        ("retries: -1\n", "field 'retries': expected a whole number from 0 to 100, got -1"),
        ("retries: 1.5\n", "expected a whole number from 0 to 100, got 1.5"),
    ],
)
def test_bad_quiet_step_settings_are_refused(tmp_path, text, needle):
    m = write(tmp_path, "m.yaml", "workload: small-gpt\n" + text + "topologies: {emu-2x2: [ddp]}\n")
    with pytest.raises(ConfigError) as info:
        validation.load_matrix(m)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("flag", "needle"),
    [("--max-steal=2", "--max-steal: expected a finite number > 0 and <= 1"), ("--retries=-2", "--retries")],
)
def test_bad_quiet_step_flags_are_one_line_and_exit_2(tmp_path, capsys, flag, needle):
    m = write(tmp_path, "m.yaml", "workload: small-gpt\ntopologies: {emu-2x2: [ddp]}\n")
    assert run_cli(["validate", "--matrix", str(m), "--out", str(tmp_path / "o"), flag]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_core_sharing_keeps_the_rounds_the_hypervisor_left_alone(monkeypatch):
    shares = {4: [0.3, 0.0, 0.2, 0.05, 0.0], 8: [0.4] * 6}
    caps = {4: [1.0, 1.9, 1.2, 1.8, 1.7], 8: [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]}
    timed: dict[int, int] = {4: 0, 8: 0}

    class Clock:
        def start(self):
            pass

        def stop(self):
            return Steal(0.0, shares[self.n][timed[self.n] - 1])

    clock = Clock()

    def rate(ctx, batch, seconds, n):
        clock.n = n
        timed[n] += 1
        return caps[n][timed[n] - 1], 0.012

    monkeypatch.setattr(cores, "StealClock", lambda: clock)
    monkeypatch.setattr(cores, "_cpu_bench", lambda workload: None)
    monkeypatch.setattr(cores, "_model_step", lambda ctx, batch: None)
    monkeypatch.setattr(cores, "median_time", lambda *a: 0.1)
    monkeypatch.setattr(cores, "_forked_cpu", lambda ctx, batch, iters, n: (1.0, 1.0, 0.010))  # alone: its probe
    monkeypatch.setattr(cores, "_forked_rate", rate)
    got = cores.measure_core_sharing("small-gpt", 4, [4, 8])
    assert timed == {4: 5, 8: cores.SHARING_ROUNDS_MAX}  # until 3 quiet rounds, or the most it times
    assert got["cpu_capacity"]["4"] == 1.8 and got["steal_share"]["4"] == 0.0  # the quiet rounds' medians
    assert got["cpu_capacity"]["8"] == pytest.approx(1.25) and got["steal_share"]["8"] == 0.4  # none quiet: all
    assert got["probe_inflation"]["4"] == pytest.approx(1.2)


def test_the_cores_capacity_is_a_rate_while_every_process_runs():
    ctx = cores._cpu_bench("tiny-gpt")
    alone, probe = cores._forked_rate(ctx, 2, 0.3, 1)
    # the bounds a rate cannot leave whatever else runs on the machine (its lower figures depend on the load)
    assert 0 < alone <= 1.02 and probe > 0  # one process: at most one core's second per second
    two, _ = cores._forked_rate(ctx, 2, 0.3, 2)
    assert 0 < two <= min(2, os.cpu_count() or 1) + 0.02  # never more than the processes or the cores
