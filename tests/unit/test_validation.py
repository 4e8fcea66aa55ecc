"""shardsim validate without real runs: the matrix, bad input, the summary, resuming, profiles.

The real thing (runs in emulated clusters, needs root) is tests/test_validation_real.py."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest

from shardsim.cli import main
from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError
from shardsim.runtime import validation
from shardsim.runtime.emulation import iproute, namespaces
from shardsim.runtime.validation import Row, load_matrix, measure, summarize
from shardsim.simulator.hardware.profile import load_profile, parse_profile
from shardsim.simulator.predict import predict
from shardsim.simulator.results import StrategyKey
from shardsim.specs.hardware.topology import make_cluster
from tests.helpers import plan_ops, run_record


def run_cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_default_matrix_covers_what_the_issue_names():
    m = load_matrix()
    assert [t for t, _ in m.topologies] == ["emu-2x2", "emu-4x2"]
    assert len(m.configs) >= 12
    for top, cfgs in m.topologies:
        world = make_cluster(top).world
        labels = {c.strategy.label() for c in cfgs}
        assert {"ddp", "zero"} <= labels
        degrees = {c.strategy.degree for c in cfgs if c.strategy.kind == "zero2d"}
        assert degrees == {d for d in range(2, world) if world % d == 0}  # every valid degree
        assert {c.strategy.schedule for c in cfgs if c.strategy.kind == "pipeline"} == {"gpipe", "1f1b"}
        assert all(c.backend == "gloo" and c.topology == top for c in cfgs)
    assert m.microbatch_sizes() == [2, 4]  # data parallel: 4 a rank; pp=2 x 4 split into 4 microbatches


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("topologies: {no-such-top: [ddp]}\n", "field 'topologies.no-such-top': unknown topology"),
        ("topologies: {p4d.24xlarge: [ddp]}\n", "is not emulated"),
        ("topologies: {emu-2x2: [zero3]}\n", "field 'topologies.emu-2x2[0]': unknown strategy 'zero3'"),
        ("topologies: {emu-2x2: [{strategy: zero2d, degree: 3}]}\n", "degree 3 does not divide the world size 4"),
        ("topologies: {emu-2x2: [{strategy: pipeline, pp: 2, bogus: 1}]}\n", "field 'topologies.emu-2x2[0].bogus'"),
        ("topologies: {emu-2x2: []}\n", "expected a list of configurations"),
        ("workload: nope\ntopologies: {emu-2x2: [ddp]}\n", "unknown workload 'nope'"),
        ("steps: 0\ntopologies: {emu-2x2: [ddp]}\n", "field 'steps'"),
        ("colour: red\ntopologies: {emu-2x2: [ddp]}\n", "field 'colour': unknown key"),
        ("topologies: [emu-2x2\n", "malformed YAML"),
    ],
    ids=["topology", "not-emulated", "strategy", "degree", "key", "empty", "workload", "steps", "top-key", "yaml"],
)
def test_bad_matrix_is_one_line_and_exit_2(tmp_path, capsys, text, needle):
    path = write(tmp_path, "m.yaml", text)
    out = tmp_path / "out"
    assert run_cli(["validate", "--matrix", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardsim: error: ") and str(path) in err, err
    assert needle in err
    assert not (out / "validation.json").exists()


def _row(top: str, label: str, pred: float, meas: float, kind: str = "zero2d", degree: int = 2) -> Row:
    s = StrategyKey(kind, degree, 1, 1, None, True)
    r = Row(top, 1, 4, "cpu", "small-gpt", s, label, predicted_s=pred, measured_s=meas, status="ok")
    r.error_pct = 100 * (pred - meas) / meas
    return r


def test_summary_errors_and_best_agreement():
    rows = [
        _row("a", "zero", 2.2, 2.0, "zero", 4),  # +10 %
        _row("a", "zero2d d=2", 1.0, 1.0),  # 0 %: best both ways
        _row("a", "ddp", 1.6, 2.0, "ddp", 1),  # -20 %
        _row("b", "zero", 3.0, 3.0, "zero", 8),
        _row("b", "pipeline", 2.0, 3.3, "pipeline", 1),  # predicted best, measured worst
        _row("b", "zero2d d=2", 2.9, 2.9),  # measured best
    ]
    s = summarize(rows)
    assert s["mape_pct"] == pytest.approx((10 + 0 + 20 + 0 + 100 * 1.3 / 3.3 + 0) / 6)
    assert s["max_error_pct"] == pytest.approx(100 * 1.3 / 3.3)
    assert s["topologies"]["a"]["best_agrees"] and s["topologies"]["a"]["degree_agrees"]
    b = s["topologies"]["b"]
    assert (b["predicted_best"], b["measured_best"], b["best_agrees"]) == ("pipeline", "zero2d d=2", False)
    assert b["regret_pct"] == pytest.approx(100 * (3.3 - 2.9) / 2.9)
    assert (b["predicted_best_degree"], b["measured_best_degree"]) == (2, 2)  # among ddp/zero/zero2d
    assert s["best_agrees"] is False and s["degree_agrees"] is True


PROFILE = {
    "workload": "small-gpt",
    "blocks_by_batch_s": {
        "2": {"embed": [0.001, 0.002], **{f"layer{i}": [0.01, 0.02] for i in range(8)}, "head": [0.002, 0.004]},
        "4": {"embed": [0.002, 0.004], **{f"layer{i}": [0.018, 0.036] for i in range(8)}, "head": [0.004, 0.008]},
    },
    "optimizer_per_param_s": 1e-8,
    "links": {"emu-2x2": {"nic_Bps": 2.4e7, "nic_latency_s": 2e-5, "loopback_Bps": 2e9, "loopback_latency_s": 1e-5}},
    "host": {"cores": 2, "effective_cores": {"4": 1.8, "8": 1.6}},
}


def _profile(tmp_path: Path) -> Path:
    from shardsim.simulator.workload.resolve import load_workload

    names = [b.name for b in load_workload("small-gpt").blocks]
    doc = json.loads(json.dumps(PROFILE))
    for b in ("2", "4"):
        table = list(doc["blocks_by_batch_s"][b].values())
        doc["blocks_by_batch_s"][b] = dict(zip(names, table, strict=True))
    return write(tmp_path, "profile.json", json.dumps(doc))


def test_profile_is_read_checked_and_applied(tmp_path):
    path = _profile(tmp_path)
    prof = load_profile(path, "small-gpt")
    name = next(iter(prof.blocks[4]))
    assert prof.block_time(name, 4) == (0.002, 0.004)  # measured size: as measured
    assert prof.block_time(name, 8) == pytest.approx((0.004, 0.008))  # nearest size, scaled linearly
    assert prof.block_time(name, 1) == pytest.approx((0.0005, 0.001))
    assert prof.block_time("no-such-block", 4) is None
    assert prof.cores_for(4, 2) == 1.8 and prof.cores_for(8, 2) == 1.6 and prof.cores_for(6, 2) == 1.6
    c = prof.apply(make_cluster("emu-2x2"))
    assert c.instance.nic.rate_gbps * 1e9 / 8 * c.instance.nic.efficiency == pytest.approx(2.4e7)
    assert c.instance.fabric.port_GBps == 2.0 and c.instance.fabric.latency_us == pytest.approx(10)
    assert prof.apply(make_cluster("emu-4x2")) == make_cluster("emu-4x2")  # not profiled: unchanged
    with pytest.raises(ConfigError, match="profile is for workload 'small-gpt', not 'tiny-gpt'"):
        load_profile(path, "tiny-gpt")
    with pytest.raises(ConfigError, match="field 'links.emu-2x2.nic_Bps'"):
        parse_profile({**PROFILE, "links": {"emu-2x2": {"nic_Bps": -1}}}, "p.json", "small-gpt")


def test_profile_changes_the_prediction_the_way_it_says(tmp_path):
    """Slower measured links and fewer effective cores: never a faster step."""
    path = _profile(tmp_path)
    cfg = RunConfig(workload="small-gpt", topology="emu-2x2", nodes=None, backend="gloo", checkpointing=False)

    base = predict(cfg.replace(profile=str(path)))
    doc = json.loads(path.read_text())
    doc["links"]["emu-2x2"]["nic_Bps"] /= 2
    doc["host"]["effective_cores"]["4"] /= 2
    slow = write(tmp_path, "slow.json", json.dumps(doc))
    worse = predict(cfg.replace(profile=str(slow)))
    assert worse.breakdown["compute_s"] == pytest.approx(2 * base.breakdown["compute_s"], rel=1e-6)
    assert worse.step_time_s > base.step_time_s


def test_a_profile_of_another_workload_is_refused(tmp_path, capsys):
    path = _profile(tmp_path)
    m = write(tmp_path, "m.yaml", "workload: tiny-gpt\ntopologies: {emu-2x2: [ddp]}\n")
    assert run_cli(["validate", "--matrix", str(m), "--profile", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "profile is for workload 'small-gpt', not 'tiny-gpt'" in capsys.readouterr().err


def no_namespaces(monkeypatch) -> None:
    """No namespaces, no root: bringing an emulated cluster up and down is a no-op."""
    monkeypatch.setattr(namespaces, "emulated", lambda c: contextlib.nullcontext(c))
    monkeypatch.setattr(iproute, "check_privileges", lambda: None)


@pytest.fixture
def fake_cluster(monkeypatch):
    """No namespaces, no root: the emulated cluster is a no-op, measurements come from `measured`."""
    no_namespaces(monkeypatch)
    calls: list[str] = []
    measured: dict[str, float | None] = {}

    def fake_measure(cfg, matrix, cluster, runs, threads):
        label = cfg.strategy.label()
        calls.append(label)
        t = measured.get(label, 1.0)
        if t is None:
            return None, "rank 1 failed at step 2: RuntimeError: boom"
        return run_record(run_id=label, step_time_s=t, step_times_s=[t * 0.99, t, t * 1.02]), ""

    monkeypatch.setattr(measure, "run_config", fake_measure)
    return calls, measured


def test_validate_is_resumable_and_keeps_finished_rows(tmp_path, fake_cluster, capsys):
    calls, measured = fake_cluster
    m = write(
        tmp_path, "m.yaml", "workload: small-gpt\ncheckpointing: false\ntopologies: {emu-2x2: [ddp, zero, zero2d]}\n"
    )
    out = tmp_path / "out"
    prof = str(_profile(tmp_path))
    measured["zero"] = None  # fails midway
    assert run_cli(["validate", "--matrix", str(m), "--out", str(out), "--profile", prof, "--json"]) == 1
    assert calls == ["ddp", "zero", "zero2d d=2"]
    cap = capsys.readouterr()
    assert "1 run(s) failed" in cap.err and "rank 1 failed at step 2" in cap.err
    doc = json.loads((out / "validation.json").read_text())
    status = {r["label"]: r["status"] for r in doc["rows"]}
    assert status["ddp"] == "ok" and status["zero2d d=2"] == "ok" and status["zero"].startswith("failed: rank 1")
    assert doc["rows_ok"] == 2 and (out / "scatter.png").exists() and (out / "errors.png").exists()

    calls.clear()
    measured["zero"] = 2.0
    assert run_cli(["validate", "--matrix", str(m), "--out", str(out), "--profile", prof, "--json"]) == 0
    assert calls == ["zero"]  # only what was missing
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) >= {"rows", "mape_pct", "max_error_pct", "best_agrees"}
    rows = {r["label"]: r for r in printed["rows"]}
    assert rows["ddp"]["measured_s"] == 1.0 and rows["zero"]["measured_s"] == 2.0
    for r in printed["rows"]:
        assert r["error_pct"] == pytest.approx(100 * (r["predicted_s"] - r["measured_s"]) / r["measured_s"])
    assert printed["mape_pct"] == pytest.approx(sum(abs(r["error_pct"]) for r in printed["rows"]) / 3)
    csv_lines = (out / "validation.csv").read_text().splitlines()
    assert len(csv_lines) == 4 and csv_lines[0].startswith("topology,nodes,world,device,workload,strategy_kind,")

    calls.clear()  # a bound that the errors pass: exit 1 with the reason, rows intact
    assert run_cli(["validate", "--matrix", str(m), "--out", str(out), "--profile", prof, "--max-error", "0"]) == 1
    assert calls == [] and "exceeds --max-error 0 %" in capsys.readouterr().err
    assert json.loads((out / "validation.json").read_text())["rows_ok"] == 3


def test_unwritable_output_folder_is_refused(tmp_path, capsys):
    blocker = write(tmp_path, "file", "")
    assert run_cli(["validate", "--matrix", str(validation.MATRICES / "ci.yaml"), "--out", str(blocker / "x")]) == 2
    assert f"{blocker / 'x'}: field 'out': cannot make its folder" in capsys.readouterr().err


def test_ci_matrix_is_small():
    m = load_matrix(validation.MATRICES / "ci.yaml")
    assert len(m.topologies) == 1 and 3 <= len(m.configs) <= 5
    assert not math.isnan(m.timeout)


def test_linkbench_fit_recovers_the_alpha_beta_of_a_ring_all_gather():
    from shardsim.runtime.profile.linkbench import fit

    k, bw, alpha = 2, 3e8, 1e-3
    sizes = (64 * 1024, 8 * 1024 * 1024)
    times = tuple((k - 1) * alpha + (k - 1) / k * s / bw for s in sizes)
    got_bw, got_alpha = fit(k, sizes, times)
    assert got_bw == pytest.approx(bw) and got_alpha == pytest.approx(alpha)


def test_a_ring_step_costs_at_least_the_links_one_way_trip():
    """A fit whose small size went at the full rate has no per-step cost left (clamped at 0);
    the profile keeps the TCP probe's one-way latency instead, and a positive fit as it is."""
    from shardsim.runtime.profile.links import ring_figures

    bench = {"loopback_Bps": 3e8, "loopback_latency_s": 0.0, "nic_ring_Bps": 2.4e7, "nic_ring_latency_s": 0.0}
    got = ring_figures(bench, 1.6e-5, 2.2e-5)
    assert got == {"loopback_Bps": 3e8, "loopback_latency_s": 1.6e-5, "nic_Bps": 2.4e7, "nic_latency_s": 2.2e-5}
    bench |= {"loopback_latency_s": 1e-3, "nic_ring_latency_s": 2e-3}
    got = ring_figures(bench, 1.6e-5, 2.2e-5)
    assert got["loopback_latency_s"] == 1e-3 and got["nic_latency_s"] == 2e-3
    assert "nic_Bps" not in ring_figures(bench, 1.6e-5, None)  # one node: no NIC
    assert ring_figures(bench | {"nic_pair_gather_Bps": 1.8e7}, 1.6e-5, 2.2e-5)["nic_pair_gather_Bps"] == 1.8e7
    assert ring_figures(bench | {"call_wait_s": 3.5e-3}, 1.6e-5, 2.2e-5)["call_wait_s"] == 3.5e-3


def test_the_sharded_optimizer_overhead_goes_to_fsdp_ranks_only(tmp_path):
    """FSDP2's Adam on DTensors costs a measured overhead per step whatever the shard: every
    zero/zero2d rank pays it whole, a sharded pipeline stage its share of the parameters, DDP
    (and a replicated stage) nothing. A negative figure is bad input."""
    import dataclasses

    from shardsim.config import Strategy

    base = load_profile(_profile(tmp_path), "small-gpt")
    extra = dataclasses.replace(base, sharded_optimizer_overhead_s=0.05)

    def opt_s(prof, **strategy) -> dict[int, float]:
        """Each rank class's optimizer op: its work in seconds (before the cores are shared)."""
        cfg = RunConfig(workload="small-gpt", topology="emu-2x2", nodes=2, batch_per_device=4, precision="fp32",
                        checkpointing=False, backend="gloo", strategy=Strategy(**strategy))  # fmt: skip
        return {op.rank_class: op.duration for op in plan_ops(cfg, prof) if op.kind == "optimizer"}

    for kind in (dict(kind="zero"), dict(kind="zero2d", degree=2)):
        assert opt_s(extra, **kind)[0] == pytest.approx(opt_s(base, **kind)[0] + 0.05, rel=1e-6)
    assert opt_s(extra, kind="ddp") == pytest.approx(opt_s(base, kind="ddp"))
    sharded_pipe = dict(kind="pipeline", pp=2, degree=2, microbatches=4, schedule="1f1b")
    with_extra, without = opt_s(extra, **sharded_pipe), opt_s(base, **sharded_pipe)
    added = [with_extra[s] - without[s] for s in without]
    assert all(0 < x < 0.05 for x in added) and sum(added) == pytest.approx(0.05, rel=1e-6)
    plain_pipe = dict(kind="pipeline", pp=2, microbatches=4, schedule="1f1b")
    assert opt_s(extra, **plain_pipe) == pytest.approx(opt_s(base, **plain_pipe))
    doc = json.loads(_profile(tmp_path).read_text()) | {"sharded_optimizer_overhead_s": -1}
    with pytest.raises(ConfigError, match="sharded_optimizer_overhead_s"):
        parse_profile(doc, "p.json", "small-gpt")
    assert extra.slowed(2.0).sharded_optimizer_overhead_s == pytest.approx(0.1)


def test_a_slower_host_scales_the_measured_compute(tmp_path):
    prof = load_profile(_profile(tmp_path), "small-gpt")
    name = next(iter(prof.blocks[4]))
    slow = prof.slowed(1.5)
    assert slow.block_time(name, 4) == pytest.approx((0.003, 0.006))
    assert slow.optimizer_per_param_s == pytest.approx(1.5e-8)
    assert slow.links == prof.links and slow.effective_cores == prof.effective_cores


def test_predictions_use_the_host_speed_pooled_over_the_runs(tmp_path, fake_cluster, monkeypatch):
    """The yardstick is timed before and after each run (a run's "before" is the last run's
    "after" when that was read just now); every prediction is scaled by the mean of all of them
    (this host flips between speeds faster than one run lasts)."""
    import shardsim.runtime.profile as profiling
    from shardsim.simulator.predict import predict

    doc = json.loads(_profile(tmp_path).read_text())
    doc["host"]["yardstick_all_cores_s"] = 0.5
    prof = write(tmp_path, "p.json", json.dumps(doc))
    # slowdowns 2 and 4 around the first run, 4 (the same reading) and 2 around the second
    timings = iter([1.0, 2.0, 1.0])
    monkeypatch.setattr(profiling, "yardstick", lambda workload, batch: next(timings))  # as validate imports it
    m = write(tmp_path, "m.yaml", "workload: small-gpt\ncheckpointing: false\ntopologies: {emu-2x2: [ddp, zero]}\n")
    matrix = validation.load_matrix(m)
    rows, _ = validation.validate(matrix, tmp_path / "o", profile=str(prof))
    assert [(r.host_slowdown_before, r.host_slowdown_after) for r in rows] == [(2.0, 4.0), (4.0, 2.0)]
    assert next(timings, None) is None  # three readings for two runs
    assert validation.pooled_slowdown(rows) == 3.0
    profile = load_profile(prof, "small-gpt")
    for cfg, r in zip(matrix.configs, rows, strict=True):
        assert r.host_slowdown == 3.0
        assert r.predicted_s == pytest.approx(predict(cfg, profile=profile.slowed(3.0)).step_time_s)
        assert r.predicted_s > predict(cfg, profile=profile).step_time_s


def test_with_a_probe_in_profile_and_run_no_yardstick_is_timed(tmp_path, fake_cluster, monkeypatch):
    """A run whose ranks timed the probe is predicted at its probe's speed: validate times the
    yardstick (seconds of every core) only after a run that brought no probe reading."""
    import shardsim.runtime.profile as profiling

    doc = json.loads(_profile(tmp_path).read_text())
    doc["host"]["yardstick_all_cores_s"], doc["probe_s"] = 0.5, 0.01
    prof = write(tmp_path, "p.json", json.dumps(doc))
    timed: list[int] = []
    monkeypatch.setattr(profiling, "yardstick", lambda workload, batch: timed.append(batch) or 1.0)

    def probed(cfg, matrix, cluster, runs, threads):
        label = cfg.strategy.label()
        probe = {"host_probe_s": 0.02} if label == "ddp" else {}
        return run_record(run_id=label, step_time_s=1.0, step_times_s=[1.0, 1.0, 1.0], **probe), ""

    monkeypatch.setattr(measure, "run_config", probed)
    m = write(tmp_path, "m.yaml", "workload: small-gpt\ncheckpointing: false\ntopologies: {emu-2x2: [ddp, zero]}\n")
    rows, _ = validation.validate(validation.load_matrix(m), tmp_path / "o", profile=str(prof))
    assert len(timed) == 1  # after zero's run, which has no probe; none around ddp's
    ddp, zero = rows
    assert (ddp.host_speed_from, ddp.host_slowdown) == ("probe", pytest.approx(2.0))
    assert math.isnan(ddp.host_slowdown_before) and math.isnan(ddp.host_slowdown_after)
    assert (zero.host_speed_from, zero.host_slowdown, zero.host_slowdown_after) == ("yardstick", 2.0, 2.0)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("steps: 1000000000\n", "field 'steps': expected a whole number from 1 to 100,000, got 1000000000"),
        ("warmup: 100000000\n", "field 'warmup': expected a whole number from 0 to 100,000"),
        ("retries: 100000000\n", "field 'retries': expected a whole number from 0 to 100"),
        ("timeout: 1.0e+30\n", "field 'timeout': expected a finite number from 1 to 86,400"),
        ("batch_per_devcie: 4\n", "field 'batch_per_devcie': unknown key; did you mean 'batch_per_device'?"),
        ("colour: red\n", "field 'colour': unknown key; expected workload, batch_per_device, "),
    ],
    ids=["steps", "warmup", "retries", "timeout", "misspelt", "unknown"],
)
def test_a_matrix_is_bounded_and_a_misspelt_key_named_before_anything_runs(tmp_path, text, needle):
    path = write(tmp_path, "m.yaml", text + "topologies: {emu-2x2: [ddp]}\n")
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    assert needle in str(err.value), err.value


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ("{strategy: zero2d, degre: 2}", "field 'topologies.emu-2x2[0].degre': unknown key; did you mean 'degree'?"),
        ("zer0", "field 'topologies.emu-2x2[0]': unknown strategy 'zer0'; did you mean 'zero'?"),
    ],
)
def test_a_misspelt_configuration_of_a_matrix_is_named_with_the_one_meant(tmp_path, entry, needle):
    path = write(tmp_path, "m.yaml", f"topologies: {{emu-2x2: [{entry}]}}\n")
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    assert needle in str(err.value), err.value


@pytest.mark.parametrize("stale", ["call_wait_s", "nic_queue_s"])
def test_a_profile_without_a_call_wait_or_of_another_nic_queue_is_measured_again(tmp_path, monkeypatch, stale):
    """validate's own profile is reused when it covers the matrix; one whose links predate the
    call wait (which predictions on a shared host use), or were measured with another tbf queue
    on the emulated NICs, is measured again, and says so."""
    from shardsim.runtime import profile as profile_mod
    from shardsim.runtime.emulation.plan import QUEUE_LATENCY_S
    from shardsim.runtime.validation.profiling import ensure_profile

    m = load_matrix(validation.MATRICES / "ci.yaml")
    doc = json.loads((Path(validation.__file__).parents[3] / "experiments/validation/profile.json").read_text())
    links = {"call_wait_s": 0.002, "nic_queue_s": QUEUE_LATENCY_S}
    doc["links"] = {"emu-2x2": doc["links"]["emu-2x2"] | links}
    doc["blocks_by_batch_s"] = {str(b): doc["blocks_by_batch_s"]["4"] for b in m.microbatch_sizes()}
    doc["tp_share_by_batch"] = {str(b): {"2+sp": [0.9, 0.8]} for b in m.microbatch_sizes()}
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    built: list[str] = []
    monkeypatch.setattr(profile_mod, "build_profile", lambda workload, *a, **kw: built.append(workload) or doc)
    said: list[str] = []
    assert ensure_profile(m, tmp_path, None, said.append) == str(tmp_path / "profile.json")
    assert not built and said == [f"profile: reusing {tmp_path / 'profile.json'}"]
    if stale == "call_wait_s":
        del doc["links"]["emu-2x2"]["call_wait_s"]
    else:
        doc["links"]["emu-2x2"]["nic_queue_s"] = QUEUE_LATENCY_S / 5
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    ensure_profile(m, tmp_path, None, said.append)
    why = "call wait" if stale == "call_wait_s" else f"links at today's NIC queue ({QUEUE_LATENCY_S * 1e3:g} ms)"
    assert built == ["small-gpt"] and f"lacks emu-2x2's {why}" in said[1]
