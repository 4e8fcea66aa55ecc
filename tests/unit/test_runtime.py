"""The runtime's pieces that need no process group: bad input stops before anything is
spawned (one line, exit status 2), the data layout, result files, failure diagnosis."""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import shardsim.runtime.plan as rcli
from shardsim import cli
from shardsim.config import SETTINGS, RunConfig, Strategy, load_config
from shardsim.core.errors import WriteError
from shardsim.runtime import data
from shardsim.runtime.launch import CONFIG_FILE, RankView, diagnose, write_config
from shardsim.runtime.models.builders import build_model
from shardsim.runtime.records import CSV_COLUMNS, CSV_NAME, LAB_KEYS, load_run, write_run
from shardsim.runtime.status import RankStatus, classify, describe
from shardsim.runtime.strategies.pipeline import split_stage
from shardsim.runtime.testing import Fault
from shardsim.runtime.train import build_parser, rank_config
from shardsim.simulator.results import upgrade_record
from shardsim.specs.model.library import PRESETS
from tests.helpers import run_record

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str]) -> int:
    """`shardsim run ARGS` through the one CLI (its error handler turns bad input into exit 2)."""
    return cli.main(["run", *args])


@pytest.fixture
def no_spawn(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a process was spawned for bad input")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(rcli, "gpu_count", lambda: 0)


EMU = ["--topology", "emu-2x2", "--workload", "tiny-gpt"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([*EMU, "--strategy", "zero2d", "--degree", "3"], "degree 3 does not divide the world size 4"),
        ([*EMU, "--nproc", "3", "--strategy", "zero2d", "--degree", "2"], "degree 2 does not divide the world size 3"),
        ([*EMU, "--strategy", "pipeline", "--pp", "3"], "pipeline degree 3 does not divide the world size 4"),
        ([*EMU, "--strategy", "pipeline", "--pp", "2", "--degree", "4"], "degree 4 does not divide"),
        (["--topology", "emu-2x2", "--workload", "no-such-model"], "unknown workload 'no-such-model'"),
        (["--topology", "emu-2x2", "--workload", "no_such_pkg.mod:build"], "no module named 'no_such_pkg.mod'"),
        ([], "at most 8"),  # the seed's 8 x g4dn.12xlarge is 32 ranks: too many for a CPU run by default
    ],  # the flags' own ranges (--steps 0, --nproc 0) are refused as they are parsed: tests/unit/test_flag_bounds.py
    ids=["zero2d-degree", "zero2d-nproc", "pp-degree", "pp-shard", "model", "import-path", "cpu-32"],
)
def test_bad_input_is_one_line_and_exit_2_before_spawning(no_spawn, capsys, args, needle):
    assert _run(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardsim: error: ")
    assert needle in err


def test_more_ranks_than_gpus_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("spawned"))
    monkeypatch.setattr(rcli, "gpu_count", lambda: 2)
    base = ["--topology", "p4d.24xlarge", "--nodes", "1", "--workload", "tiny-gpt", "--strategy", "ddp"]
    assert _run(base) == 2  # 8 devices per p4d node, 2 GPUs here
    assert "8 ranks on this machine but it has 2 GPU(s)" in capsys.readouterr().err
    assert _run([*base, "--nproc", "3"]) == 2
    assert "3 ranks on this machine but it has 2 GPU(s)" in capsys.readouterr().err


def test_bad_input_from_the_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "shardsim.cli", "run", "--topology", "emu-2x2", "--workload", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown workload 'nope'" in proc.stderr
    assert proc.stdout == ""


def test_config_travels_to_the_workers_unchanged(tmp_path, monkeypatch):
    cfg = load_config(
        None,
        {"workload": "tiny-gpt", "topology": "emu-2x2", "strategy": "pipeline", "pp": 2, "degree": 2,
         "microbatches": 4, "schedule": "gpipe", "grad_accum": 3, "precision": "bf16", "checkpointing": False,
         "seed": 7, "batch_per_device": 2},
    )  # fmt: skip
    write_config(tmp_path, cfg)
    monkeypatch.setenv("SHARDSIM_RUN_DIR", str(tmp_path))
    again = rank_config(build_parser().parse_args([]))  # under shardsim run: the run folder's JSON
    assert again.to_dict() == cfg.to_dict()
    by_flag = rank_config(build_parser().parse_args(["--config-json", str(tmp_path / CONFIG_FILE)]))
    assert by_flag == again
    assert rank_config(build_parser().parse_args(["--seed", "3"])).seed == 3  # flags given: they are read


# Settings the ranks do not read: the simulator's inputs (a profile, a calibration). Every other
# setting must reach the workers, or they run its default.
# library and its DeepSpeed settings: the prediction's, not the run's; context parallelism, Float8
# and the MoE what-ifs: the runtime refuses them (`runtime.stack`)
NOT_FOR_RANKS = {"profile", "calibration", "library", "deepspeed", "cp", "cp_rotate", "float8", "float8_all_gather",
                 "moe_imbalance", "moe_capacity"}  # fmt: skip


def test_every_setting_the_ranks_read_travels_to_them(tmp_path, monkeypatch):
    """A non-default value of every schema setting survives the run folder's JSON → the rank."""
    values = {"workload": "tiny-gpt", "topology": "emu-2x2", "nodes": 2, "strategy": "zero2d", "degree": 2,
              "batch_per_device": 3, "grad_accum": 2,
              "precision": "bf16", "reshard_after_forward": False, "checkpointing": "selective",
              "selective_ac_option": "2", "reduce_dtype": "fp32", "backend": "gloo", "optimizer_impl": "fused",
              "seed": 5, "seq_len": 16, "hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1, "ffn": 64,
              "vocab": 128, "tp": 2, "sequence_parallel": True, "async_tp": True, "mesh_order": "pp,tp,dp",
              "tp_across_nodes": True, "optimizer": "sgd", "attention": "math", "compile": True,
              "mlm_fraction": 0.25, "gpus_per_node": 1}  # fmt: skip
    # a zero2d's have no value of their own (a pipeline's travel below; ep, which needs experts and
    # tp 1 on the ranks; etp, which needs ep with tp, which the runtime refuses)
    pipeline = {"pp", "microbatches", "schedule", "stages_per_rank", "layers_per_stage"}
    missing = {s.name for s in SETTINGS} - NOT_FOR_RANKS - pipeline - {"ep", "etp"} - set(values)
    assert not missing, f"add a non-default value for {missing}"
    cfg = load_config(None, values)
    write_config(tmp_path, cfg)
    monkeypatch.setenv("SHARDSIM_RUN_DIR", str(tmp_path))
    again = rank_config(build_parser().parse_args([]))
    assert again.to_dict() == cfg.to_dict()
    d = again.to_dict()
    flat = {**d, **d["strategy"], **d["shape"], "strategy": d["strategy"]["kind"]}
    assert {k: flat[k] for k in values} == values
    piped = load_config(None, {"workload": "tiny-gpt", "strategy": "pipeline", "pp": 2, "microbatches": 4,
                               "schedule": "zbv", "stages_per_rank": 2, "layers_per_stage": "1,1,1,1"})  # fmt: skip
    write_config(tmp_path, piped)
    assert rank_config(build_parser().parse_args([])).to_dict() == piped.to_dict()
    experts = load_config(None, {"workload": "tiny-moe", "strategy": "zero", "ep": 2})
    write_config(tmp_path, experts)
    assert rank_config(build_parser().parse_args([])).strategy.ep == 2


def test_global_batch_is_the_ranks_slices_concatenated():
    model = build_model(PRESETS["tiny-gpt"])
    world, bpd, pp = 4, 3, 2
    whole = data.global_batch(model.sample_batch, bpd, world, 0, 5, 1)
    ranks = [data.local_batch(model.sample_batch, bpd, 1, 0, 5, 1, r) for r in range(world)]
    replicas = [data.local_batch(model.sample_batch, bpd, pp, 0, 5, 1, j) for j in range(world // pp)]
    for parts in (ranks, replicas):
        assert torch.equal(torch.cat([p[0] for p in parts]), whole[0])
        assert torch.equal(torch.cat([p[1] for p in parts]), whole[1])
    other = data.global_batch(model.sample_batch, bpd, world, 0, 6, 1)
    assert not torch.equal(other[0], whole[0])  # a new batch every step


def test_pipeline_stages_partition_the_model_with_its_own_names():
    model = build_model(PRESETS["tiny-gpt"])
    names = {n for n, _ in model.named_parameters()}
    got: list[str] = []
    for s in range(3):
        stage = split_stage(model, s, 3)
        got += [n for n, _ in stage.named_parameters()]
        assert (stage.embed is not None) == (s == 0) and (stage.head is not None) == (s == 2)
    assert sorted(got) == sorted(names)
    x, _ = model.sample_batch(2, torch.Generator().manual_seed(0))
    y = x
    for s in range(3):
        y = split_stage(model, s, 3)(y)
    assert torch.equal(y, model(x))


def test_results_are_written_atomically_and_appended(tmp_path):
    cfg = run_record().config | {"workload": "w", "backend": "nccl"}
    rec = run_record(run_id="a", config=cfg, workload="w", backend="gloo", step_time_s=0.5)
    write_run(dataclasses.replace(rec, step_times_s=[0.5, 0.6]), tmp_path)
    write_run(dataclasses.replace(rec, run_id="b", step_time_s=0.7), tmp_path)
    assert json.loads((tmp_path / "a.json").read_text())["step_times_s"] == [0.5, 0.6]
    assert load_run(tmp_path / "b.json") == dataclasses.replace(rec, run_id="b", step_time_s=0.7)
    rows = list(csv.DictReader(open(tmp_path / CSV_NAME)))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [r["run_id"] for r in rows] == ["a", "b"] and rows[1]["step_time_s"] == "0.7"
    assert rows[0]["step_times_s"] == "0.5;0.6" and rows[0]["strategy_kind"] == "zero"
    assert rows[0]["backend"] == "gloo" and rows[0]["workload"] == "w"  # what ran, not what was asked
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_row_says_the_checkpointing_mode_and_the_selective_option(tmp_path):
    base = RunConfig(workload="small-gpt", topology="emu-2x2", nodes=2, backend="gloo", strategy=Strategy("zero"))
    modes = {
        "none": (base.replace(checkpointing="none"), "none", ""),
        "full": (base.replace(checkpointing="full"), "full", ""),
        "op": (base.replace(checkpointing="selective"), "selective", "op"),
        "k2": (base.replace(checkpointing="selective", selective_ac_option="2"), "selective", "2"),
    }
    for name, (cfg, _, _) in modes.items():
        rec = run_record(run_id=name, config=cfg.to_dict())
        write_run(rec, tmp_path)
        assert load_run(tmp_path / f"{name}.json") == rec
        assert load_run(tmp_path / f"{name}.json").config == cfg.to_dict()
    rows = {r["run_id"]: r for r in csv.DictReader(open(tmp_path / CSV_NAME))}
    for name, (_, mode, option) in modes.items():
        assert (rows[name]["checkpointing"], rows[name]["selective_ac_option"]) == (mode, option), name


def test_committed_run_files_load_as_records(tmp_path):
    """Every run file under experiments/ loads, field for key (older ones lack the host
    readings: None; those written before the result key are read in its form, each value
    where the key puts it); the lab's readings, top-level keys in older files, under `lab`, and
    none where a file (a GPU run's) has none of them; a file that is not a record is a ValueError."""
    docs = {p: json.loads(p.read_text()) for p in sorted(ROOT.glob("experiments/**/*.json"))}
    runs = {p: d for p, d in docs.items() if isinstance(d, dict) and d.get("source") == "measured"}
    assert runs
    gpu = 0
    for p, doc in runs.items():
        got, want = load_run(p).to_dict(), upgrade_record(doc)
        flat = {k: v for k, v in got.items() if k != "lab"} | got.get("lab", {})
        if isinstance(want.get("lab"), dict):  # today's files hold the readings under `lab`
            want = {k: v for k, v in want.items() if k != "lab"} | want["lab"]
        assert {k: flat.get(k) for k in want} == want and all(flat[k] is None for k in set(flat) - set(want)), p
        readings = doc.get("lab") or doc
        assert ("lab" in got) == any(readings.get(k) is not None for k in LAB_KEYS), p
        gpu += doc["memory_measure"] == "cuda_max_memory_allocated" and "lab" not in got
        if "label" not in doc:  # before the key: the label was `strategy`, the allocated peak `memory_per_rank_gib`
            assert (got["label"], got["memory_allocated_gib"]) == (doc["strategy"], doc["memory_per_rank_gib"])
            assert got["strategy"]["kind"] == doc["config"]["strategy"]["kind"] and got["world"] == doc["world"]
    assert gpu > 0  # the committed GPU runs' records hold no lab
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(next(iter(runs.values())) | {"nope": 1}))
    with pytest.raises(ValueError, match="unknown key 'nope'"):
        load_run(bad)
    bad.write_text(json.dumps({"run_id": "a"}))
    with pytest.raises(ValueError, match="not a run record"):
        load_run(bad)


def _view(rank, *, status=None, t=None, died=None, step=3, **extra):
    st = {"status": status, "time": t, "step": step, **extra} if status else None
    return RankView(rank, pid=100 + rank, step=step, status=st, died_at=died)


def test_diagnosis_names_the_rank():
    crash = {0: _view(0, status="peer", t=2.0), 1: _view(1, status="error", t=1.0, type="ValueError", message="bad")}
    assert diagnose(crash, 1, 10).startswith("rank 1 failed at step 3: ValueError: bad")
    killed = {0: _view(0, status="peer", t=2.0), 1: _view(1, died=1.9), 2: _view(2, status="peer", t=2.1)}
    msg = diagnose(killed, 1, 10)
    assert msg.startswith("rank 1 (pid 101) died at step 3 without reporting an error")
    hung = {0: _view(0, status="timeout", t=5.0), 1: _view(1, died=5.4), 2: _view(2, status="peer", t=5.01)}
    want = "rank 1 stopped responding at step 3: rank 0 timed out after 4 s waiting for it in a collective"
    assert diagnose(hung, 1, 4) == want
    assert classify("Timed out waiting 3000ms for recv operation to complete") == "timeout"
    assert classify("Connection closed by peer [127.0.0.1]:1234") == "peer"


def test_a_run_whose_result_could_not_be_written_is_named_as_such(tmp_path):
    """Every step ran: the line says the result is what is missing, and which file."""
    message = "cannot write out/runs.csv: No space left on device; written: r.json"
    views = {0: _view(0, status="error", t=1.0, type="WriteError", message=message), 1: _view(1, status="ok", t=1.1)}
    assert diagnose(views, 0, 10) == f"rank 0 ran every step but could not write the result: {message}"
    status = RankStatus(str(tmp_path), 0)
    status.failed(WriteError(28, "No space left on device", "out/runs.csv"))
    status.finished()  # the rank ends cleanly after reporting: its report stays
    assert json.loads((tmp_path / "rank0.json").read_text())["type"] == "WriteError"


def test_a_wrapped_failure_is_reported_by_its_cause_then_its_wrapper(tmp_path):
    """An error raised from another (pipelining wraps a stage's backward error in a RuntimeError
    that lists tensors) is named by the innermost cause, which the 300-character line keeps."""
    try:
        try:
            raise ValueError("grad of a tensor that does not require grad")
        except ValueError as inner:
            raise RuntimeError("Failed to run stage backward:\n  Stage output: " + "x" * 400) from inner
    except RuntimeError as exc:
        wrapped = exc
    kind, message = describe(wrapped)
    assert kind == "ValueError" and message.startswith("grad of a tensor that does not require grad (raised inside ")
    assert "RuntimeError: Failed to run stage backward: Stage output: xxx" in message
    assert describe(ValueError("plain")) == ("ValueError", "plain") and describe(KeyError())[1] == "KeyError"
    status = RankStatus(str(tmp_path), 1)
    status.failed(wrapped)
    report = json.loads((tmp_path / "rank1.json").read_text())
    assert report["type"] == "ValueError" and report["message"].startswith("grad of a tensor")


def test_fault_spec_targets_one_rank_and_step():
    assert Fault("raise@1:2", 0).at is None
    f = Fault("raise@1:2", 1)
    f.check(1)
    with pytest.raises(RuntimeError, match="injected fault at step 2"):
        f.check(2)
