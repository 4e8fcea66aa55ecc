"""shardsim calibrate: measurements read from CSVs and run records, the fit recovers the model's
own parameters, folds partition the rows, bad rows are one line, a calibration file applies."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from shardsim.cli import main
from shardsim.config import RunConfig, Strategy
from shardsim.core.errors import ConfigError
from shardsim.runtime.records import write_run
from shardsim.simulator.calibration import calibrate as C
from shardsim.simulator.calibration import fit as F
from shardsim.simulator.calibration import prior as P
from shardsim.simulator.calibration.apply import Calibration, Fitted, read_calibration, write_calibration
from shardsim.simulator.calibration.measurements import read_measurements
from shardsim.simulator.model_error import step_error
from shardsim.simulator.predict import predict
from shardsim.specs.hardware.topology import load_instance
from tests.helpers import run_record

TOPOLOGY = "a100-40gb-roce"
MPT = {"family": "mpt", "positions": "learned", "tied_embeddings": "true", "vocab": 50368}
# small MPT-style models: GEMM-bound, attention-bound, floor-bound and multi-node (exposed comm) rows
ROWS = [
    {"hidden": 2048, "layers": 4, "heads": 16, "seq_len": 2048, "batch_per_device": 8, "nodes": 1},
    {"hidden": 2048, "layers": 4, "heads": 16, "seq_len": 2048, "batch_per_device": 2, "nodes": 1},
    {"hidden": 1024, "layers": 4, "heads": 8, "seq_len": 16384, "batch_per_device": 1, "nodes": 1},
    {"hidden": 768, "layers": 4, "heads": 12, "seq_len": 8192, "batch_per_device": 1, "nodes": 1},
    {"hidden": 256, "layers": 4, "heads": 4, "seq_len": 256, "batch_per_device": 1, "nodes": 1},
    {"hidden": 256, "layers": 4, "heads": 4, "seq_len": 512, "batch_per_device": 2, "nodes": 1},
    {"hidden": 4096, "layers": 2, "heads": 32, "seq_len": 2048, "batch_per_device": 1, "nodes": 2},
    {"hidden": 4096, "layers": 2, "heads": 32, "seq_len": 1024, "batch_per_device": 1, "nodes": 4},
    {"hidden": 2048, "layers": 2, "heads": 16, "seq_len": 512, "batch_per_device": 1, "nodes": 2},
]
TRUE = {
    "matmul_efficiency.bf16": 0.62,
    "attention_efficiency": 0.7,
    "rank_time_cv": 0.03,
    "kernel_floor_us": 20.0,
    "nic_efficiency": 0.5,
}


def write_csv(path: Path, rows: list[dict]) -> Path:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return path


def synthetic(tmp_path: Path) -> tuple[Path, list]:
    """A CSV of the model's own predictions with `TRUE` over the topology's figures."""
    inst = load_instance(TOPOLOGY)
    base = [MPT | r | {"strategy": "zero", "precision": "bf16", "checkpointing": "none"} for r in ROWS]
    rows = read_measurements(write_csv(tmp_path / "m.csv", [r | {"step_time_s": 1.0} for r in base]), TOPOLOGY, inst)
    steps = [p.step_time_s for p in F.predictions(inst, rows, TRUE)]
    path = write_csv(tmp_path / "m.csv", [r | {"step_time_s": s} for r, s in zip(base, steps, strict=True)])
    return path, read_measurements(path, TOPOLOGY, inst)


def test_fit_recovers_the_models_own_parameters(tmp_path):
    _, rows = synthetic(tmp_path)
    inst = load_instance(TOPOLOGY)
    names, notes = F.fitted_names(inst, rows)
    assert set(names) == set(TRUE) and not notes
    assert np.abs(F.ratios(inst, rows, {}) - 1).mean() > 0.1  # the defaults are off
    f = F.fit(inst, rows, names)
    for n, v in TRUE.items():
        assert f.values[n] == pytest.approx(v, rel=0.03), n
    assert np.abs(F.ratios(inst, rows, f.values) - 1).max() < 0.01


def test_folds_partition_the_rows():
    for n, k in ((78, 5), (10, 3), (5, 5)):
        fs = F.folds(n, k)
        every = np.concatenate(fs)
        assert len(fs) == k and sorted(every.tolist()) == list(range(n))
        assert max(map(len, fs)) - min(map(len, fs)) <= 1
    assert [f.tolist() for f in F.folds(20, 4)] == [f.tolist() for f in F.folds(20, 4)]  # seeded
    with pytest.raises(ConfigError):
        F.folds(3, 5)


def test_llm_foundry_columns_are_read_as_the_mpt_family(tmp_path):
    row = {"model": "mpt-125m", "d_model": 768, "n_heads": 12, "n_layers": 12, "expansion_ratio": 4,
           "vocab_size": 50368, "seq_len": 2048, "gpus": 16, "gpus_per_node": 8, "microbatch": 26,
           "grad_accum": 1, "precision": "bf16", "mp_mode": "PURE", "sharding_strategy": "FULL_SHARD",
           "activation_checkpointing": "False", "num_params": 125311488, "tokens_per_s_per_gpu": 130535.0}  # fmt: skip
    (m,) = read_measurements(write_csv(tmp_path / "f.csv", [row]), TOPOLOGY, load_instance(TOPOLOGY))
    a = m.workload.arch
    assert (a.family, a.hidden, a.ffn_size, a.tied_embeddings, a.position_kind) == ("mpt", 768, 3072, True, "learned")
    assert (m.nodes, m.cfg.batch_per_device, m.cfg.checkpointing, m.cfg.grad_dtype) == (2, 26, "none", "bf16")
    assert m.cfg.strategy.kind == "zero" and m.metric == "tokens_per_s_per_gpu"


@pytest.mark.parametrize(
    ("change", "column"),
    [
        ({"microbatch": "x"}, "microbatch"),
        ({"gpus": 12}, "gpus"),
        ({"n_heads": 7}, "n_heads"),
        ({"num_params": 1000}, "num_params"),
        ({"tokens_per_s_per_gpu": -3}, "tokens_per_s_per_gpu"),
        ({"sharding_strategy": "ZERO9"}, "sharding_strategy"),
    ],
)
def test_a_bad_row_is_one_line_naming_its_line_and_column_exit_2(tmp_path, capsys, change, column):
    good = {"model": "m", "d_model": 256, "n_heads": 4, "n_layers": 2, "expansion_ratio": 4, "vocab_size": 1000,
            "seq_len": 128, "gpus": 8, "microbatch": 2, "grad_accum": 1, "precision": "bf16",
            "activation_checkpointing": "False", "tokens_per_s_per_gpu": 1000.0}  # fmt: skip
    path = write_csv(tmp_path / "bad.csv", [good, good | change])
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", str(path), "--topology", TOPOLOGY, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.csv line 3:" in err[0] and f"'{column}'" in err[0], err
    assert not out.exists()


def test_a_bad_output_path_fails_before_any_work(tmp_path, capsys):
    missing = tmp_path / "nowhere.csv"  # would fail later: the output is checked first
    (tmp_path / "file").write_text("")
    assert main(["calibrate", str(missing), "--topology", TOPOLOGY, "--out", str(tmp_path / "file" / "c.yaml")]) == 2
    assert "field 'out': cannot make its folder" in capsys.readouterr().err


def test_run_json_files_and_runs_csv_are_read(tmp_path):
    cfg = RunConfig(workload="small-gpt", topology=TOPOLOGY, nodes=1, precision="bf16", strategy=Strategy("zero"))
    rec = run_record(config=cfg.to_dict(), topology=TOPOLOGY, nodes=1, world=8, global_batch=32, step_time_s=0.25)
    write_run(rec, tmp_path)
    inst = load_instance(TOPOLOGY)
    (m,) = read_measurements(tmp_path, TOPOLOGY, inst)  # the folder's JSON files
    assert (m.metric, m.measured, m.cfg.workload, m.cfg.precision) == ("step_time_s", 0.25, "small-gpt", "bf16")
    (c,) = read_measurements(tmp_path / "runs.csv", TOPOLOGY, inst)
    assert (c.cfg.strategy.kind, c.measured, c.cfg.batch_per_device) == ("zero", 0.25, m.cfg.batch_per_device)


def test_a_calibration_file_round_trips_and_changes_a_prediction(tmp_path):
    inst = load_instance(TOPOLOGY)
    cal = Calibration(
        device=inst.device.model,
        topology=TOPOLOGY,
        parameters={
            "matmul_efficiency.bf16": Fitted(0.5, 0.8686, 0.3, 1.0),
            "kernel_floor_us": Fitted(50.0, 35.0, 2.0, 100.0),
        },
        fitted_to={"rows": 3},
        errors={"after": {"mae_pct": 1.0}},
    )
    path = tmp_path / "cal.yaml"
    write_calibration(path, cal)
    assert read_calibration(path) == cal
    cfg = RunConfig(workload="gpt2-xl", topology=TOPOLOGY, nodes=1, precision="bf16", batch_per_device=2)
    before, after = predict(cfg), predict(cfg.replace(calibration=str(path)))
    assert after.step_time_s > before.step_time_s * 1.2
    assert (
        cfg.to_dict()["calibration"] is None and cfg.replace(calibration="c.yaml").to_dict()["calibration"] == "c.yaml"
    )
    other = cfg.replace(topology="p5.48xlarge")  # another device: refused, naming the setting
    with pytest.raises(ConfigError, match="calibration"):
        predict(other.replace(calibration=str(path)))


def test_the_calibration_flag_is_generated(tmp_path, capsys):
    assert main(["predict", "--topology", TOPOLOGY, "--nodes", "1", "--precision", "bf16", "--workload", "gpt2-xl",
                 "--calibration", str(tmp_path / "none.yaml")]) == 2  # fmt: skip
    assert "calibration" in capsys.readouterr().err


def test_more_folds_than_rows_is_leave_one_out_with_a_note(tmp_path, capsys, monkeypatch):
    path, rows = synthetic(tmp_path)
    three = write_csv(tmp_path / "three.csv", list(csv.DictReader(path.read_text().splitlines()))[:3])
    monkeypatch.setenv("COLUMNS", "70")
    assert main(["calibrate", str(three), "--topology", TOPOLOGY, "--folds", "5"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("row ") or " line " in line]
    assert len(table) == 4 and len({line.split("(")[0] for line in table[1:]}) == 3  # each row named once, whole
    assert all(f"three.csv line {i})" in table[i - 1] for i in (2, 3, 4))
    prose = [line for line in out.splitlines() if line not in table and " " in line.strip()]  # a long path: a word
    assert all(len(line) <= 70 for line in prose), out  # prose wraps at COLUMNS
    assert "5 folds asked, 3 rows: leave-one-out (3 folds)" in out and "leave-one-out CV" in out
    assert C.choose_folds(3, None) == (3, "") and C.choose_folds(9, None) == (9, "")
    assert C.choose_folds(10, None) == (5, "") and C.choose_folds(40, 4) == (4, "")
    assert C.choose_folds(1, None)[0] == 0 and C.choose_folds(30, 0) == (0, "")


def test_one_row_fits_what_it_determines_holds_the_rest_and_says_so(tmp_path, capsys):
    path, _ = synthetic(tmp_path)
    one = write_csv(tmp_path / "one.csv", list(csv.DictReader(path.read_text().splitlines()))[:1])
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", str(one), "--topology", TOPOLOGY, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "± inf" not in printed and "FORCED" not in printed
    assert "WARNING: 4 parameters for 1 informative row(s)" in printed
    assert "cross-validation: none, one row" in printed
    cal = read_calibration(out)
    assert not cal.warning and list(cal.parameters) == ["matmul_efficiency.bf16"]  # one row: one direction
    assert set(cal.fit["held"]) == {"attention_efficiency", "rank_time_cv", "kernel_floor_us"}
    assert all("held at its default" in why for why in cal.fit["held"].values())
    assert len(cal.fit["covariance_log"]) == 1 and cal.fit["covariance_log"][0][0] > 0
    assert "held at its default" in printed and "determined: the scaled Jacobian's singular values" in printed


def test_rows_of_one_model_warn_that_its_own_error_is_read_as_the_stacks(tmp_path):
    path, rows = synthetic(tmp_path)
    assert C.one_model(rows[:2]) is not None and C.one_model(rows[:3]) is None and C.one_model(rows[:1]) is None
    first, second = list(csv.DictReader(path.read_text().splitlines()))[:2]
    two = write_csv(tmp_path / "two.csv", [first, second | {"seq_len": "1024"}])  # one model at two lengths
    r = C.calibrate(two, TOPOLOGY, params=("matmul_efficiency.bf16",))
    said = [w for w in r.warnings if w.startswith("every measured run is of one model (mpt, hidden 2048, 4 layers)")]
    assert len(said) == 1 and "measure a second model size" in said[0]
    assert said[0] in r.calibration.fit["warnings"]


def test_the_rank_test_holds_the_weakest_direction_and_keeps_the_rest():
    jac = np.array([[10.0, 0.0, 0.01], [0.0, 8.0, 0.01], [10.0, 8.0, 0.02]])
    kept, held, s = P.select(jac, ("a", "b", "c"))
    assert kept == ("a", "b") and list(held) == ["c"] and s.min() >= 1 / P.PRIOR_SIGMA
    collinear = np.array([[5.0, 5.0], [10.0, 10.0]])  # two parameters the rows see only as a product
    kept, held, _ = P.select(collinear, ("x", "y"))
    assert len(kept) == 1 and len(held) == 1
    assert P.select(np.zeros((2, 2)), ("x", "y"))[0] == ()


def test_the_prior_shrinks_toward_the_default_and_the_errors_are_finite(tmp_path):
    _, rows = synthetic(tmp_path)
    inst = load_instance(TOPOLOGY)
    names = ("matmul_efficiency.bf16",)
    f = P.map_fit(inst, rows[:1], names)
    free = F.fit(inst, rows[:1], names)  # without the prior: through the row
    default, true = 0.8686, TRUE["matmul_efficiency.bf16"]
    assert abs(free.values[names[0]] - default) > abs(f.values[names[0]] - default) > 0  # shrunk, not held
    assert true < f.values[names[0]] < default
    assert np.isfinite(f.stderr[names[0]]) and 0 < f.stderr[names[0]] < default * P.PRIOR_SIGMA


def test_a_fit_at_a_bound_warns_though_it_misses_the_rows_by_little(tmp_path, capsys):
    inst = load_instance(TOPOLOGY)
    path, rows = synthetic(tmp_path)
    # 15 % faster than the model can be with every GEMM at the dense peak
    fast = [p.step_time_s * 0.85 for p in F.predictions(inst, rows, {"matmul_efficiency.bf16": 1.0})]
    cells = list(csv.DictReader(path.read_text().splitlines()))
    bound = write_csv(tmp_path / "b.csv", [r | {"step_time_s": t} for r, t in zip(cells, fast, strict=True)])
    argv = ["calibrate", str(bound), "--topology", TOPOLOGY, "--folds", "0", "--params", "matmul_efficiency.bf16"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "AT BOUND" in out and "WARNING: matmul_efficiency.bf16 ended at a bound" in out


def test_a_calibrated_prediction_carries_its_band(tmp_path, capsys):
    path, _ = synthetic(tmp_path)
    three = write_csv(tmp_path / "three.csv", list(csv.DictReader(path.read_text().splitlines()))[:3])
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", str(three), "--topology", TOPOLOGY, "--out", str(out), "--folds", "0"]) == 0
    argv = ["predict", "--topology", TOPOLOGY, "--nodes", "1", "--precision", "bf16", "--workload", "gpt2-xl"]
    capsys.readouterr()
    assert main([*argv, "--calibration", str(out), "--json"]) == 0
    band = json.loads(capsys.readouterr().out)["calibration_band"]
    assert 0 < band["parameters_pct"] < 25 and band["sensitivity"]["matmul_efficiency.bf16"] > 0.3
    # the total is the parameters' share and the model's own error for the A100, added as independent errors
    model = band["model_error"]
    assert model["measured"] and model["sigma_log"] >= 0.05
    params = math.log1p(band["parameters_pct"] / 100)
    assert band["band_pct"] == pytest.approx(100 * math.expm1(math.hypot(params, model["sigma_log"])))
    assert band["band_pct"] > max(band["parameters_pct"], model["band_pct"])
    assert main([*argv, "--calibration", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"% step time (one sigma, {out}): fitted parameters ±" in text and "the model's own error ±" in text
    old = read_calibration(out)
    write_calibration(out, replace(old, fit={}))  # a file written before the covariance and the model's error
    assert main([*argv, "--calibration", str(out), "--json"]) == 0
    band = json.loads(capsys.readouterr().out)["calibration_band"]
    assert band["parameters_pct"] is None and "not determined" in band["note"]
    assert band["band_pct"] == pytest.approx(100 * math.expm1(step_error("NVIDIA A100 SXM4 40GB").sigma))


def test_the_help_gives_the_input_columns_and_wraps_at_whole_names():
    env = {**os.environ, "COLUMNS": "70"}
    text = subprocess.run(
        [sys.executable, "-m", "shardsim", "calibrate", "--help"], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "tokens_per_s_per_gpu" in text and "step_time_s" in text and "docs/examples/calibration-3-rows.csv" in text
    assert max(len(line) for line in text.splitlines()) <= 70
    words = set(re.findall(r"[a-z_]+(?:\.[A-Za-z0-9]+)?", text))
    for name in ("matmul_efficiency", "attention_efficiency", "kernel_floor_us", "nic_size_factor.16MiB"):
        assert name in words, name  # whole on one line, never cut


def test_rows_in_other_units_end_at_the_bounds_and_are_refused(tmp_path, capsys):
    path, _ = synthetic(tmp_path)
    rows = list(csv.DictReader(path.read_text().splitlines()))
    ms = write_csv(tmp_path / "ms.csv", [r | {"step_time_s": float(r["step_time_s"]) * 1000} for r in rows])
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", str(ms), "--topology", TOPOLOGY, "--folds", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ended at a bound" in err[0] and "more than 25 %" in err[0], err
    assert not out.exists()


def test_rows_of_one_configuration_do_not_determine_two_parameters(tmp_path):
    _, rows = synthetic(tmp_path)
    inst = load_instance(TOPOLOGY)
    names = ("matmul_efficiency.bf16", "kernel_floor_us")
    f = F.fit(inst, [rows[0]] * 3, names)  # one GEMM-bound configuration measured three times
    assert f.informative == 3 and "kernel_floor_us" in f.undetermined and all(np.isinf(list(f.stderr.values())))
    why = F.untrusted(f, 0.0)
    assert why is not None and "the rows do not determine" in why and "kernel_floor_us" in why
    good = F.fit(inst, rows, names)
    assert F.untrusted(good, 0.0) is None and not good.undetermined and all(np.isfinite(list(good.stderr.values())))


def test_standard_errors_are_the_least_squares_ones_and_a_blind_parameter_is_named():
    rng = np.random.default_rng(1)
    jac = rng.normal(size=(12, 3))
    informative, undetermined, err = F._uncertainty(jac, 0.5, ("a", "b", "c"))
    classic = np.sqrt(np.diag(np.linalg.inv(jac.T @ jac)) * 0.5 / (12 - 3))
    assert informative == 12 and undetermined == () and err == pytest.approx(classic, rel=1e-9)
    jac[:, 1] = 0.0  # no row depends on b
    jac[:4] = 0.0  # nor on anything, in four rows
    informative, undetermined, err = F._uncertainty(jac, 0.5, ("a", "b", "c"))
    assert informative == 8 and undetermined == ("b",) and np.isinf(err).all()


def test_records_without_nodes_are_read_with_the_nodes_their_world_fills(tmp_path):
    """`shardsim run` records `nodes` only when --nodes was given; the world the run had decides."""
    inst = load_instance("emu-2x2")  # 2 devices a node
    for world, nodes in ((2, 1), (4, 2)):
        folder = tmp_path / f"w{world}"
        cfg = RunConfig(workload="tiny-gpt", topology="emu-2x2", nodes=None, backend="gloo", strategy=Strategy("zero"))
        write_run(run_record(config=cfg.to_dict(), nodes=None, world=world, workload="tiny-gpt"), folder)
        for source in (folder, folder / "runs.csv"):
            (m,) = read_measurements(source, "emu-2x2", inst)
            assert (m.nodes, m.cfg.strategy.kind, m.measured) == (nodes, "zero", 1.0), source
    folder = tmp_path / "w3"
    write_run(run_record(nodes=None, world=3), folder)
    for source, where in ((folder, "run.json"), (folder / "runs.csv", "runs.csv line 2")):
        with pytest.raises(ConfigError, match="3 devices do not fill whole nodes of emu-2x2") as err:
            read_measurements(source, "emu-2x2", inst)
        assert err.value.where.endswith(where) and err.value.field == "world"


GOOD = {"model": "m", "d_model": 256, "n_heads": 4, "n_layers": 2, "expansion_ratio": 4, "vocab_size": 1000,
        "seq_len": 128, "gpus": 8, "microbatch": 2, "grad_accum": 1, "precision": "bf16",
        "activation_checkpointing": "False", "tokens_per_s_per_gpu": 1000.0}  # fmt: skip


def calibrate_refuses(argv: list[str], capsys) -> str:
    assert main(["calibrate", *argv]) == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardsim: error: "), err
    return err.strip()


@pytest.mark.parametrize("value", ["inf", "Infinity", "1e300", "1e-300"])
def test_a_measurement_that_is_not_finite_or_beyond_its_bounds_is_one_line(tmp_path, capsys, value):
    path = write_csv(tmp_path / "m.csv", [GOOD, GOOD | {"tokens_per_s_per_gpu": value}, GOOD])
    err = calibrate_refuses([str(path), "--topology", TOPOLOGY, "--folds", "0"], capsys)
    assert "m.csv line 3: field 'tokens_per_s_per_gpu': expected a finite number from " in err, err


@pytest.mark.parametrize("value", [float("inf"), 1e308])
def test_a_run_record_whose_step_time_is_beyond_its_bounds_is_one_line(tmp_path, capsys, value):
    cfg = RunConfig(workload="tiny-gpt", topology="emu-2x2", nodes=None, backend="gloo", strategy=Strategy("zero"))
    for i in range(3):
        step = value if i == 1 else 0.05 * (i + 1)
        write_run(run_record(run_id=f"r{i}", config=cfg.to_dict(), world=2, step_time_s=step), tmp_path)
    err = calibrate_refuses([str(tmp_path), "--topology", "emu-2x2", "--folds", "0"], capsys)
    assert f"{tmp_path / 'r1.json'}: field 'step_time_s': expected a finite number from " in err, err


def test_a_misspelt_column_is_refused_with_the_column_meant(tmp_path, capsys):
    row = {("micrbatch" if k == "microbatch" else k): v for k, v in GOOD.items()}
    path = write_csv(tmp_path / "m.csv", [row, row | {"tokens_per_s_per_gpu": 2000.0}])
    err = calibrate_refuses([str(path), "--topology", TOPOLOGY, "--folds", "0"], capsys)
    assert f"{path} line 1: field 'micrbatch': unknown column; did you mean 'microbatch'?" in err, err
    notes = write_csv(tmp_path / "n.csv", [GOOD | {"notes": "x", "mfu_pct": 1.0, "gpu": "A100"}])
    assert len(read_measurements(notes, TOPOLOGY, load_instance(TOPOLOGY))) == 1  # other columns: read as notes


def test_a_runs_csv_and_the_calibration_set_read_without_a_column_refused(tmp_path):
    cfg = RunConfig(workload="tiny-gpt", topology="emu-2x2", nodes=None, backend="gloo", strategy=Strategy("zero"))
    write_run(run_record(config=cfg.to_dict(), world=2), tmp_path)
    assert len(read_measurements(tmp_path / "runs.csv", "emu-2x2", load_instance("emu-2x2"))) == 1
    data = Path(__file__).resolve().parents[2] / "experiments" / "calibration" / "data" / "mpt-a100-40gb.csv"
    assert len(read_measurements(data, TOPOLOGY, load_instance(TOPOLOGY))) > 50


def test_a_whole_number_cell_is_read_exactly(tmp_path, capsys):
    path = write_csv(tmp_path / "m.csv", [GOOD | {"gpus": "99999999999999999999999992"}])
    err = calibrate_refuses([str(path), "--topology", TOPOLOGY, "--folds", "0"], capsys)
    assert "line 2: field 'gpus': 12,499,999,999,999,999,999,999,999 is beyond" in err, err


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ("matmul_efficiency.fp8", "a100-40gb-roce has no matmul_efficiency.fp8; expected one of "),
        ("matmul_efficency", "unknown parameter 'matmul_efficency'; did you mean 'matmul_efficiency'?"),
    ],
)
def test_a_parameter_the_topology_lacks_or_misspelt_is_one_line(tmp_path, capsys, params, words):
    path, _ = synthetic(tmp_path)
    err = calibrate_refuses([str(path), "--topology", TOPOLOGY, "--folds", "0", "--params", params], capsys)
    assert words in err, err
