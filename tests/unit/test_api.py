"""The public API (`import shardsim`, docs/api.md): the documented example runs cell by cell; the
import is cheap; each function answers as the command does and refuses bad input with one
ConfigError naming the field."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import shardsim
from shardsim.cli import main
from shardsim.config import RunConfig, load_config
from shardsim.simulator.calibration.apply import read_calibration
from shardsim.simulator.collective import simulate_collective
from shardsim.simulator.predict import predict as simulate
from shardsim.specs.hardware.topology import make_cluster
from shardsim.sweep.recommendation import recommend
from shardsim.sweep.space import SweepSpace
from tests.api_doc import DOC, cells, run_cells, with_outputs

ROOT = Path(__file__).resolve().parents[2]
SEED_FILE = ROOT / "experiments" / "seed" / "zero2d-4.yaml"
MEASURED = ROOT / "experiments" / "calibration" / "data" / "mpt-a100-40gb.csv"
TINY = {"workload": "tiny-gpt"}


def test_the_docs_example_runs_cell_by_cell_and_prints_what_it_shows(monkeypatch) -> None:
    text = DOC.read_text()
    shown = [out for _, out in cells(text)]
    assert len(shown) >= 5 and all(shown), "each cell shows its output"
    printed, ns = run_cells(text)
    for i, (out, want) in enumerate(zip(printed, shown, strict=True)):
        assert out == want, f"{DOC.name} cell {i + 1} prints other than it shows: run python tests/api_doc.py"
    # what the cells computed is what the functions underneath give
    monkeypatch.chdir(ROOT)  # the example names files relative to the repository
    cfg = load_config(SEED_FILE.relative_to(ROOT), {"batch_per_device": 2})
    assert ns["cfg"] == cfg and ns["pred"].to_dict() == simulate(cfg).to_dict()
    assert ns["rec"] == recommend(ns["table"], cfg.library) and ns["rec"].sharded_data_parallel_degree is not None
    assert f"sharded_data_parallel_degree: {ns['rec']['sharded_data_parallel_degree']}" in printed[2]
    assert set(ns["cal"].values) == {"attention_efficiency"} and "ConfigError on 'nodes'" in printed[-1]


def test_the_outputs_are_written_in_place_of_the_shown_ones() -> None:
    text = DOC.read_text()
    assert with_outputs(text, [out for _, out in cells(text)]) == text
    blank = with_outputs(text, [""] * len(cells(text)))
    assert "Output:" not in blank and with_outputs(blank, [out for _, out in cells(text)]) == text


def test_import_shardsim_loads_no_heavy_module() -> None:
    heavy = ("torch", "matplotlib", "pandas", "numpy", "simpy", "scipy")
    code = f"import shardsim, sys; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_public_name_resolves() -> None:
    for name in shardsim.__all__:
        assert getattr(shardsim, name) is not None, name
    assert set(shardsim.__all__) <= set(dir(shardsim))
    assert isinstance(shardsim.__version__, str) and shardsim.ConfigError is shardsim.api.ConfigError
    with pytest.raises(AttributeError):
        _ = shardsim.no_such_name


def test_shardsim_sweep_stays_the_function_when_its_package_is_imported() -> None:
    """`shardsim/sweep/` is also a subpackage: importing it must not bind `shardsim.sweep` to it."""
    code = (
        "import shardsim, shardsim.api\n"
        "from shardsim.sweep import search, space\n"
        "import shardsim.sweep.ranking\n"
        "assert shardsim.sweep is shardsim.api.sweep, shardsim.sweep\n"
        "from shardsim import sweep\n"
        "assert sweep is shardsim.api.sweep and callable(sweep)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _refused(call, field: str) -> str:
    with pytest.raises(shardsim.ConfigError) as err:
        call()
    assert err.value.field == field, str(err.value)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_load_config_takes_overrides_and_keyword_settings_as_flags() -> None:
    assert shardsim.load_config(SEED_FILE, {"nodes": 2}, batch_per_device=2) == load_config(
        SEED_FILE, {"nodes": 2, "batch_per_device": 2}
    )
    _refused(lambda: shardsim.load_config(SEED_FILE, batch_per_device=0), "batch_per_device")
    _refused(lambda: shardsim.load_config(SEED_FILE, {"nodes": 2}, nodes=3), "nodes")
    _refused(lambda: shardsim.load_config(None, [("nodes", 2)]), "overrides")
    _refused(lambda: shardsim.load_config(42), "path")
    assert "did you mean 'nodes'" in _refused(lambda: shardsim.load_config(node=2), "node")


def test_predict_takes_a_config_a_file_a_mapping_or_nothing() -> None:
    from_file = shardsim.predict(SEED_FILE, batch_per_device=2)
    assert from_file.to_dict() == simulate(load_config(SEED_FILE, {"batch_per_device": 2})).to_dict()
    mapping = {**TINY, "nodes": 2}
    assert (
        shardsim.predict(mapping, strategy="zero").to_dict()
        == simulate(load_config(None, {**mapping, "strategy": "zero"})).to_dict()
    )
    # nothing: the seed scenario, as SageMaker's library runs it (the seed's own measurement)
    assert shardsim.predict().to_dict() == simulate(RunConfig(library="smp")).to_dict()


def test_predict_refuses_contradictory_or_unknown_inputs(tmp_path) -> None:
    cfg = load_config(None, TINY)
    _refused(lambda: shardsim.predict(cfg, nodes=4), "nodes")  # a RunConfig is complete
    _refused(lambda: shardsim.predict(cfg, workload="gpt2"), "workload")
    _refused(lambda: shardsim.predict({"nodes": 2}, nodes=4), "nodes")
    _refused(lambda: shardsim.predict(cluster=make_cluster("p4d.24xlarge", 2)), "cluster")
    _refused(lambda: shardsim.predict(workload=object()), "workload")
    _refused(lambda: shardsim.predict(42), "config")
    _refused(lambda: shardsim.predict(TINY, algo="rng"), "algo")
    (tmp_path / "file").write_text("")
    _refused(lambda: shardsim.predict(TINY, trace=tmp_path / "file" / "t.json"), "trace")  # no folder can be made


def test_predict_writes_a_trace(tmp_path) -> None:
    path = tmp_path / "step.json"
    shardsim.predict({**TINY, "nodes": 1}, trace=path)
    assert json.loads(path.read_text())["traceEvents"]


def test_sweep_returns_table_recommendation_skipped_and_dropped() -> None:
    # tp 1 only: tp 2 would keep 16 devices (24 over 8 data-parallel ranks) and leave nothing skipped
    space = SweepSpace(strategies=("zero", "pipeline"), nodes=(1, 2, 4), pp=(2, 8), global_batch=24, tp_degrees=(1,))
    result = shardsim.sweep(TINY, space, workers=1)
    assert isinstance(result, shardsim.SweepResult) and isinstance(result.recommendation, shardsim.Recommendation)
    assert result.recommendation == recommend(result.table) == shardsim.recommend(result)
    assert len(result.skipped) == 1 and "does not divide" in result.skipped[0]  # 24 over 16 devices
    assert result.dropped and all(n > 0 for n in result.dropped.values())
    assert sorted(result.table["world"].unique()) == [4, 8]
    # the axes as keywords or a mapping are the same space; one value is a list of one
    by_keywords = shardsim.sweep(TINY, strategies="zero", nodes=[1, 2], workers=1)
    by_mapping = shardsim.sweep(TINY, {"strategies": ["zero"], "nodes": (1, 2)}, workers=1)
    pd.testing.assert_frame_equal(by_keywords.table, by_mapping.table)
    assert by_keywords.table["strategy_kind"].unique().tolist() == ["zero"]


def test_sweep_calls_progress() -> None:
    seen: list[tuple[int, int]] = []
    shardsim.sweep(TINY, strategies=["ddp"], tp_degrees=[1], workers=1, progress=lambda d, n, w: seen.append((d, n)))
    assert seen[0] == (0, 1) and seen[-1] == (1, 1)


def test_sweep_refuses_bad_input() -> None:
    _refused(lambda: shardsim.sweep(TINY, SweepSpace(), strategies=["ddp"]), "strategies")
    assert "did you mean 'strategies'" in _refused(lambda: shardsim.sweep(TINY, strategie=["ddp"]), "strategie")
    _refused(lambda: shardsim.sweep(TINY, strategies=["zero3"]), "strategies")
    _refused(lambda: shardsim.sweep(TINY, space=42), "space")
    _refused(lambda: shardsim.sweep(TINY, workers=0), "workers")
    _refused(lambda: shardsim.sweep(TINY, progress="bar"), "progress")
    _refused(lambda: shardsim.sweep(TINY, algo="rng"), "algo")
    _refused(lambda: shardsim.sweep(load_config(None, TINY), nodes=[1], batch_per_device=2), "batch_per_device")


def test_recommend_refuses_what_is_not_a_sweeps_table() -> None:
    table = shardsim.sweep(TINY, strategies=["ddp", "zero"], workers=1).table
    _refused(lambda: shardsim.recommend(table.to_dict()), "table")
    _refused(lambda: shardsim.recommend(table.drop(columns=["fits"])), "fits")
    _refused(lambda: shardsim.recommend(table[table["strategy_kind"] == "pipeline"]), "table")
    assert shardsim.recommend(table[table["strategy_kind"] == "zero"]).best["strategy"]["kind"] == "zero"


def _mpt_125m(tmp_path: Path) -> Path:
    with open(MEASURED, newline="") as f:
        rows = list(csv.DictReader(f))
    path = tmp_path / "mpt-125m.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(r for r in rows if r["model"] == "mpt-125m")
    return path


def test_calibrate_reads_a_file_or_a_table_alike_and_writes_the_file(tmp_path, capsys) -> None:
    path = _mpt_125m(tmp_path)
    out = tmp_path / "cal.yaml"
    from_file = shardsim.calibrate(path, "a100-40gb-roce", params="attention_efficiency", folds=0, out=out)
    table = pd.read_csv(MEASURED)
    from_table = shardsim.calibrate(
        table[table["model"] == "mpt-125m"], "a100-40gb-roce", params=["attention_efficiency"], folds=0
    )
    assert from_file.values == from_table.values and len(from_file.rows) == 11
    assert read_calibration(out).values == from_file.values
    # the command writes the same file from the same rows
    again = tmp_path / "cli.yaml"
    argv = ["calibrate", str(path), "--topology", "a100-40gb-roce", "--params", "attention_efficiency"]
    assert main([*argv, "--folds", "0", "--out", str(again)]) == 0
    capsys.readouterr()
    assert again.read_text() == out.read_text()


def test_calibrate_refuses_bad_input(tmp_path) -> None:
    path = _mpt_125m(tmp_path)
    _refused(lambda: shardsim.calibrate(path, "a100-40gb-roce", folds=1), "folds")
    _refused(lambda: shardsim.calibrate(path, "a100-40gb-roce", folds=-1), "folds")
    _refused(lambda: shardsim.calibrate(path, "a100-40gb-roce", params=["matmul_efficiency.fp8"]), "params")
    _refused(lambda: shardsim.calibrate(path, "a100-40gb-roce", params=[]), "params")
    _refused(lambda: shardsim.calibrate(42, "a100-40gb-roce"), "measurements")
    _refused(lambda: shardsim.calibrate(pd.DataFrame(columns=["model"]), "a100-40gb-roce"), "measurements")
    _refused(lambda: shardsim.calibrate(path, "a100-40gb-roce", force="yes"), "force")
    (tmp_path / "file").write_text("")
    _refused(lambda: shardsim.calibrate(path, "a100-40gb-roce", out=tmp_path / "file" / "c.yaml"), "out")
    assert "is an input" in _refused(lambda: shardsim.calibrate(path, "a100-40gb-roce", out=path), "out")
    bad = pd.read_csv(path).assign(microbatch="four")
    assert "measurements row 0" in _refused(lambda: shardsim.calibrate(bad, "a100-40gb-roce"), "microbatch")


def test_collective_is_the_commands() -> None:
    r = shardsim.collective("all_gather", "25MB", topology="p4d.24xlarge", nodes=2, ranks=12)
    assert r == simulate_collective(make_cluster("p4d.24xlarge", 2), "all_gather", 25_000_000, "auto", "nccl", 12)
    assert shardsim.collective(size=4096).size_bytes == 4096
    _refused(lambda: shardsim.collective("allreduce"), "op")
    _refused(lambda: shardsim.collective(size="0"), "size")
    _refused(lambda: shardsim.collective(size=2**41), "size")
    _refused(lambda: shardsim.collective(backend="mpi"), "backend")
    _refused(lambda: shardsim.collective(ranks=1), "ranks")
    _refused(lambda: shardsim.collective(nodes=0), "nodes")
    _refused(lambda: shardsim.collective(algo="rng"), "algo")


# Each documented axis of `sweep` with one value, as a scalar and as a list of one; `settings`:
# what else the sweep needs for the value to apply (a small space on one p4d node).
AXES = [
    ("strategies", "zero", {}),
    ("degrees", 4, {"strategies": ["zero2d"]}),
    ("pp", 2, {"strategies": ["pipeline"]}),
    ("microbatches", 2, {"strategies": ["pipeline"], "pp": [2]}),
    ("schedules", "gpipe", {"strategies": ["pipeline"], "pp": [2]}),
    ("topologies", "p4d.24xlarge", {}),
    ("nodes", 1, {}),
    ("global_batch", 64, {}),
    ("reshard_after_forward", False, {"strategies": ["zero"]}),
    ("checkpointing", "full", {}),
    ("selective_ac_options", "op", {"checkpointing": ["selective"]}),
    ("reduce_dtypes", "fp16", {}),
    ("optimizer_impls", "fused", {}),
    ("precisions", "fp16", {}),
    ("optimizers", "sgd", {}),
    ("attentions", "math", {}),
    ("compile", True, {}),
    ("mlm_fractions", 0.15, {"config": {"workload": "bert-large", "topology": "p4d.24xlarge", "nodes": 1}}),
    ("batch_sizes", 2, {}),
    ("grad_accums", 2, {}),
    ("max_batch", 8, {}),
    ("tp_degrees", 2, {}),
]


@pytest.mark.parametrize(("axis", "value", "settings"), AXES, ids=[a[0] for a in AXES])
def test_every_documented_axis_takes_a_scalar_or_a_list(axis, value, settings) -> None:
    settings = dict(settings)
    config = settings.pop("config", {**TINY, "topology": "p4d.24xlarge", "nodes": 1})
    settings = {"strategies": ["ddp"], "tp_degrees": [1], **settings}
    one = shardsim.sweep(config, workers=1, **{**settings, axis: value})
    listed = shardsim.sweep(config, workers=1, **{**settings, axis: [value]})
    pd.testing.assert_frame_equal(one.table, listed.table)
    assert len(one.table) >= 1
    assert f"``{axis}``" in shardsim.sweep.__doc__ and f"`{axis}`" in DOC.read_text()


def test_a_scalar_axis_takes_one_number() -> None:
    _refused(lambda: shardsim.sweep(TINY, global_batch=[64, 128]), "global_batch")
    _refused(lambda: shardsim.sweep(TINY, global_batch="64"), "global_batch")
    _refused(lambda: shardsim.sweep(TINY, max_batch=8.5), "max_batch")
    _refused(lambda: shardsim.sweep(TINY, max_batch=[]), "max_batch")
    _refused(lambda: shardsim.sweep(TINY, topologies=[3]), "topologies")
    _refused(lambda: shardsim.sweep(TINY, degrees=4.0), "degrees")


def test_a_strategy_is_a_name_a_mapping_or_a_strategy_as_a_file_takes_it(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("workload: tiny-gpt\nstrategy: {kind: pipeline, pp: 2}\n")
    from_file = shardsim.predict(path).to_dict()
    assert shardsim.predict(TINY, strategy={"kind": "pipeline", "pp": 2}).to_dict() == from_file
    assert shardsim.predict({**TINY, "strategy": {"kind": "pipeline", "pp": 2}}).to_dict() == from_file
    assert shardsim.predict(TINY, strategy=shardsim.Strategy("pipeline", pp=2)).to_dict() == from_file
    assert (
        shardsim.load_config(None, TINY, strategy={"kind": "pipeline", "pp": 2}).to_dict()
        == load_config(path).to_dict()
    )
    assert "did you mean 'pp'" in _refused(
        lambda: shardsim.predict(TINY, strategy={"kind": "pipeline", "ppp": 2}), "strategy.ppp"
    )
    _refused(lambda: shardsim.predict(TINY, strategy={"kind": "pipeline", "pp": 2}, pp=4), "pp")
    _refused(lambda: shardsim.predict(TINY, strategy={"kind": "pipeline", "pp": "x"}), "pp")


WRONG_TYPES = [
    (lambda: shardsim.load_config(42), "path"),
    (lambda: shardsim.load_config(None, 42), "overrides"),
    (lambda: shardsim.predict(TINY, trace=123), "trace"),
    (lambda: shardsim.predict(TINY, algo=["ring"]), "algo"),
    (lambda: shardsim.predict(TINY, nodes="2"), "nodes"),
    (lambda: shardsim.sweep(TINY, global_batch=[64, 128]), "global_batch"),
    (lambda: shardsim.sweep(TINY, workers="2"), "workers"),
    (lambda: shardsim.sweep(TINY, progress=lambda: None), "progress"),
    (lambda: shardsim.sweep(TINY, algo=1), "algo"),
    (lambda: shardsim.sweep(TINY, strategies={"ddp": 1}), "strategies"),
    (lambda: shardsim.recommend(None), "table"),
    (lambda: shardsim.calibrate(None, "p4d.24xlarge", nccl_tests=123), "nccl_tests"),
    (lambda: shardsim.calibrate(None, "p4d.24xlarge", nccl_tests=[1, 2]), "nccl_tests"),
    (lambda: shardsim.calibrate(None, "p4d.24xlarge", params=3), "params"),
    (lambda: shardsim.calibrate(None, "p4d.24xlarge", folds="3"), "folds"),
    (lambda: shardsim.calibrate(None, "p4d.24xlarge", nodes=2.0), "nodes"),
    (lambda: shardsim.calibrate(None, "p4d.24xlarge", out=7), "out"),
    (lambda: shardsim.calibrate(None, 7), "topology"),
    (lambda: shardsim.collective(3), "op"),
    (lambda: shardsim.collective(size=[1]), "size"),
    (lambda: shardsim.collective(size=1.5), "size"),
    (lambda: shardsim.collective(size="1.5"), "size"),
    (lambda: shardsim.collective(topology=3), "topology"),
    (lambda: shardsim.collective(nodes=2.0), "nodes"),
    (lambda: shardsim.collective(algo=None), "algo"),
    (lambda: shardsim.collective(backend=["nccl"]), "backend"),
    (lambda: shardsim.collective(ranks="4"), "ranks"),
]


@pytest.mark.parametrize(("call", "field"), WRONG_TYPES, ids=[f for _, f in WRONG_TYPES])
def test_a_keyword_of_the_wrong_type_is_one_config_error_naming_it(call, field) -> None:
    _refused(call, field)


def test_recommend_refuses_columns_of_another_type() -> None:
    table = shardsim.sweep(TINY, strategies=["ddp", "zero"], workers=1).table
    _refused(lambda: shardsim.recommend(table.assign(fits="False")), "fits")
    _refused(lambda: shardsim.recommend(table.assign(fits=1)), "fits")
    _refused(lambda: shardsim.recommend(table.assign(samples_per_s="x")), "samples_per_s")
    _refused(lambda: shardsim.recommend(table.assign(label=3)), "label")
    assert shardsim.recommend(table.assign(cost_per_million_samples_usd=float("nan"))).best is not None


def test_a_size_is_a_whole_number_of_bytes() -> None:
    assert shardsim.collective(size=2.0).size_bytes == 2 and shardsim.collective(size="1.5KB").size_bytes == 1500
    assert "whole number of bytes" in _refused(lambda: shardsim.collective(size="0.3KiB"), "size")


def test_a_sweep_space_refuses_a_global_batch_or_topology_of_another_type() -> None:
    _refused(lambda: SweepSpace(global_batch="64"), "global_batch")
    _refused(lambda: SweepSpace(global_batch=64.5), "global_batch")
    _refused(lambda: SweepSpace(topologies=(3,)), "topologies")
    assert SweepSpace(global_batch=64, topologies=("p4d.24xlarge",)).global_batch == 64
