"""Every output carries the one result key (docs/results.md) under the same names and types:
`predict --json`, a sweep's rows (JSON and CSV), a validation's rows (JSON and CSV), a run
record and runs.csv; and docs/results.md lists exactly the key's fields."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from shardsim.cli import main
from shardsim.runtime.records import CSV_NAME, load_run, write_run
from shardsim.runtime.validation import load_matrix, rebuild_rows
from shardsim.runtime.validation.report import save, summarize
from shardsim.runtime.validation.resume import read_runs
from shardsim.simulator.results import KEY_COLUMNS, KEY_FIELDS, STRATEGY_FIELDS, flatten, nest
from shardsim.specs.hardware.topology import make_cluster
from tests.helpers import run_record

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "experiments" / "validation" / "runs"
OLD_RUNS = ROOT / "experiments" / "validation" / "2026-11-23" / "runs"  # a runs.csv written before the key
DOC = ROOT / "docs" / "results.md"
TINY = ["--workload", "tiny-gpt", "--topology", "g4dn.12xlarge", "--nodes", "2"]
KEY_TYPES = {"topology": str, "nodes": int, "world": int, "device": str, "workload": str, "label": str}
STRATEGY_TYPES = {
    "kind": (str,),
    "degree": (int,),
    "pp": (int,),
    "microbatches": (int,),
    "schedule": (str, type(None)),
    "reshard_after_forward": (bool, type(None)),
}


def check_key(obj: dict, where: str) -> dict:
    """`obj` carries the key, each field of its type, the strategy one object of exactly its
    fields (ddp's degree 1, a schedule only with a pipeline); returns the key."""
    assert set(KEY_FIELDS) <= set(obj), where
    for name, kind in KEY_TYPES.items():
        assert type(obj[name]) is kind, (where, name, obj[name])
    s = obj["strategy"]
    assert isinstance(s, dict) and list(s) == list(STRATEGY_FIELDS), (where, s)
    for name, kinds in STRATEGY_TYPES.items():
        assert type(s[name]) in kinds, (where, name, s[name])
    assert s["degree"] >= 1 and (s["degree"] == 1 or s["kind"] != "ddp"), (where, s)
    assert (s["schedule"] is None) == (s["kind"] != "pipeline"), (where, s)
    assert obj["label"].startswith(s["kind"]), (where, obj["label"])
    assert 1 <= obj["nodes"] <= obj["world"], where
    return {k: obj[k] for k in KEY_FIELDS}


def check_columns(header: list[str], where: str) -> None:
    """A CSV header carries the key's columns, in order and together."""
    at = header.index(KEY_COLUMNS[0])
    assert tuple(header[at : at + len(KEY_COLUMNS)]) == KEY_COLUMNS, (where, header)
    assert "strategy" not in header and "config" not in header, where


def check_row(row: dict[str, str], key: dict, where: str) -> None:
    """A CSV row's key cells are the JSON key's values as text (null: empty)."""
    for name, value in flatten(key).items():
        assert row[name] == ("" if value is None else str(value)), (where, name)


def test_predict_json_carries_the_key(capsys):
    assert main(["predict", *TINY, "--strategy", "pipeline", "--pp", "2", "--microbatches", "4", "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    key = check_key(pred, "predict --json")
    assert list(pred)[: len(KEY_FIELDS)] == list(KEY_FIELDS)
    assert key["strategy"] == {
        "kind": "pipeline",
        "degree": 1,
        "pp": 2,
        "microbatches": 4,
        "schedule": "1f1b",
        "reshard_after_forward": None,
        "tp": 1,
        "sequence_parallel": False,
        "async_tp": False,
        "cp": 1,
    }
    assert (key["nodes"], key["world"], key["label"]) == (2, 8, "pipeline pp=2 m=4 1f1b")
    mem = pred["memory_allocated_gib"], pred["memory_reserved_gib"], pred["memory_required_gib"]
    assert 0 < mem[0] < mem[1] < mem[2]  # a GPU: the allocator's reserve, then the runtime overhead


def test_a_sweep_and_a_prediction_of_one_configuration_carry_one_key(tmp_path, capsys):
    strategies = ["--strategies", "ddp,zero,zero2d,pipeline", "--pp", "2", "--workers", "1", "--no-plots"]
    assert main(["sweep", *TINY, *strategies, "--json", "--out", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["label"]: r for r in doc["rows"]}
    keys = {label: check_key(r, f"sweep row {label}") for label, r in rows.items()}
    assert {k["strategy"]["kind"] for k in keys.values()} == {"ddp", "zero", "zero2d", "pipeline"}
    for name in ("best", "runner_up", "sdp", "cheapest"):
        rec = doc["recommended"][name]
        assert check_key(rec, f"recommended {name}") == keys[rec["label"]]
    with open(tmp_path / "sweep.csv", newline="") as f:
        reader = csv.DictReader(f)
        check_columns(list(reader.fieldnames or ()), "sweep.csv")
        for row in reader:
            check_row(row, keys[row["label"]], "sweep.csv")
    assert main(["predict", *TINY, "--strategy", "zero2d", "--degree", "2", "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert check_key(pred, "predict --json") == keys["zero2d d=2"]
    for name in ("memory_allocated_gib", "memory_reserved_gib", "memory_required_gib"):
        assert pred[name] == rows["zero2d d=2"][name]


def test_validate_rows_of_committed_runs_carry_the_key(tmp_path):
    matrix = load_matrix(ROOT / "shardsim" / "data" / "matrices" / "default.yaml")
    rows = rebuild_rows(matrix, read_runs(RUNS))
    assert len(rows) > 1
    save(tmp_path, matrix, rows, summarize(rows))
    doc = json.loads((tmp_path / "validation.json").read_text())
    keys = [check_key(r, f"validation row {r['label']}") for r in doc["rows"]]
    assert {k["strategy"]["kind"] for k in keys} >= {"ddp", "zero", "zero2d", "pipeline"}
    for r in doc["rows"]:
        assert list(r)[: len(KEY_FIELDS)] == list(KEY_FIELDS)
        assert r["measured_memory_allocated_gib"] > 0
    with open(tmp_path / "validation.csv", newline="") as f:
        reader = csv.DictReader(f)
        check_columns(list(reader.fieldnames or ()), "validation.csv")
        for row, key in zip(reader, keys, strict=True):
            check_row(row, key, "validation.csv")


@pytest.mark.parametrize("path", sorted(RUNS.glob("*.json"))[:3], ids=lambda p: p.name)
def test_committed_run_records_carry_the_key(path):
    rec = load_run(path).to_dict()
    key = check_key(rec, path.name)
    cluster = make_cluster(key["topology"])
    assert (key["nodes"], key["world"]) == (cluster.nodes, cluster.world)
    assert rec["memory_allocated_gib"] == max(rec["memory_allocated_by_rank_gib"])
    assert rec["memory_reserved_gib"] is None  # a CPU run: no caching allocator


def test_a_written_run_record_and_its_runs_csv_row_carry_the_key(tmp_path):
    written = write_run(run_record(run_id="a"), tmp_path)
    key = check_key(json.loads(written.read_text()), "run record")
    with open(tmp_path / CSV_NAME, newline="") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or ())
        check_columns(header, CSV_NAME)
        assert header[:2] == ["run_id", "finished_at"] and header[2 : 2 + len(KEY_COLUMNS)] == list(KEY_COLUMNS)
        check_row(next(reader), key, CSV_NAME)


def _doc_table(heading: str) -> list[str]:
    """The first column's names (in backticks) of the table under `heading` in docs/results.md."""
    text = DOC.read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", section, flags=re.M)


def test_the_doc_lists_exactly_the_keys_fields():
    assert _doc_table("The key") == list(KEY_FIELDS)
    assert _doc_table("The strategy") == list(STRATEGY_FIELDS)


PRE_KEY = ROOT / "tests" / "fixtures" / "pre-key"  # result files as committed before the key


def _tensors_gib(memory: dict) -> float:
    """The tensors' peak of a prediction's memory parts (`MemoryBreakdown.tensors_gib`)."""
    states = memory["params_gib"] + memory["grads_gib"] + memory["optimizer_gib"]
    return states + max(memory["gathered_gib"] + memory["activations_gib"], memory["step_temporaries_gib"])


def test_a_committed_prediction_written_before_the_key_reads_as_todays():
    """The seed's prediction as committed before the key, read in today's form, has today's fields
    and the key and memory of today's prediction of its file (its step time is an earlier
    model's)."""
    from shardsim.config import load_config
    from shardsim.simulator.predict import predict
    from shardsim.simulator.results import upgrade_prediction

    committed = json.loads((PRE_KEY / "zero2d-4.prediction.json").read_text())
    assert "label" not in committed  # written before the key
    today = json.loads(predict(load_config(ROOT / "experiments" / "seed" / "zero2d-4.yaml")).to_json())
    upgraded = upgrade_prediction(committed)
    assert upgraded.keys() == today.keys()
    assert {k: upgraded[k] for k in KEY_FIELDS} == {k: today[k] for k in KEY_FIELDS}
    # the tensors' peak is today's; the allocator's figures, its rounding and pool, an earlier model's
    assert upgraded["memory_allocated_gib"] == pytest.approx(_tensors_gib(today["memory"]), rel=1e-12)
    assert upgraded["memory_required_gib"] == committed["memory_per_rank_gib"]
    assert upgrade_prediction(today) == today


def test_a_committed_sweep_table_written_before_the_key_reads_as_todays(tmp_path, capsys):
    """A committed sweep.parquet, read in today's form, has today's columns and the key's values."""
    import pandas as pd

    from shardsim.sweep.rows import columns, native, upgrade_table

    committed = pd.read_parquet(PRE_KEY / "seed-sweep.parquet")
    assert "config" in committed and "label" not in committed  # written before the key
    table = upgrade_table(committed)
    assert tuple(table.columns) == columns(False)
    for r in table.to_dict(orient="records"):
        check_key(nest({k: native(r[k]) for k in KEY_COLUMNS}), r["label"])
    assert main(["predict", "experiments/seed/zero2d-4.yaml", "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    row = table[table["label"] == "zero2d d=4"].iloc[0]
    assert {c: native(row[c]) for c in KEY_COLUMNS} == flatten({k: pred[k] for k in KEY_FIELDS})
    assert row["memory_allocated_gib"] == pytest.approx(_tensors_gib(pred["memory"]), rel=1e-12)
    assert row["memory_required_gib"] == committed.loc[row.name, "memory_per_rank_gib"]
    assert upgrade_table(table) is table


def test_a_committed_runs_csv_written_before_the_key_reads_and_grows_in_todays_columns(tmp_path):
    from shardsim.core.errors import CorruptFile
    from shardsim.runtime.records import CSV_COLUMNS, read_runs_csv

    committed = (OLD_RUNS / CSV_NAME).read_text()
    assert committed.startswith("run_id,finished_at,workload,topology,nodes,strategy,kind,")  # before the key
    (tmp_path / CSV_NAME).write_text(committed)
    header, rows = read_runs_csv(tmp_path / CSV_NAME)
    assert header == [c for c in CSV_COLUMNS if c in header]  # today's, less those that file lacks (std, ...)
    check_columns(header, CSV_NAME)
    for row in rows:
        rec = load_run(OLD_RUNS / f"{row['run_id']}.json").to_dict()
        check_row(row, {k: rec[k] for k in KEY_FIELDS}, CSV_NAME)
    write_run(run_record(run_id="new"), tmp_path)
    header, grown = read_runs_csv(tmp_path / CSV_NAME)
    assert tuple(header) == CSV_COLUMNS and [r["run_id"] for r in grown] == [r["run_id"] for r in rows] + ["new"]
    lines = committed.splitlines()
    lines[2] = lines[2].replace(",zero,zero,", ",zero,zerox,", 1)
    (tmp_path / CSV_NAME).write_text("\n".join(lines) + "\n")
    with pytest.raises(CorruptFile, match="not a run's row: its strategy") as err:
        read_runs_csv(tmp_path / CSV_NAME)
    assert err.value.where == f"{tmp_path / CSV_NAME} line 3"
