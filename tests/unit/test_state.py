"""State an earlier call left, read back: a torn validation.json is rebuilt from the runs it
indexes or named; a torn run JSON, runs.csv or validate's own profile.json is named (one line,
exit 2) before any work, never read as empty, measured again over or overwritten. Run records:
the std column (older runs.csv read as they are), the backend that ran."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from shardsim.cli import main
from shardsim.cli import run as run_cli
from shardsim.core.errors import CorruptFile
from shardsim.runtime.records import CSV_NAME, check_runs_csv, load_run, read_runs_csv, write_run
from shardsim.runtime.validation import load_matrix, measure, rebuild_rows
from shardsim.simulator.results import strategy_key
from tests.helpers import private_device, run_record
from tests.unit.test_validation import _profile, no_namespaces, write

MATRIX = "workload: small-gpt\ncheckpointing: false\ntopologies: {emu-2x2: [ddp, zero, zero2d]}\n"


def run_cli_(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("shardsim: error: "), err
    return err


@pytest.fixture
def real_records(monkeypatch):
    """Runs that write their record as a real run does (runs/<id>.json and runs.csv); every
    configuration run is listed in the returned list."""
    no_namespaces(monkeypatch)
    calls: list[str] = []

    def fake_measure(cfg, matrix, cluster, runs, threads):
        label = cfg.strategy.label()
        calls.append(label)
        n = len(calls)
        rec = run_record(
            run_id=f"run{n}-{label.replace(' ', '').replace('=', '')}",
            finished_at=f"2026-01-01T00:00:{n:02d}+00:00",
            strategy=strategy_key(cfg.strategy, 4),
            label=label,
            step_time_s=1.0 + n / 10,
            step_times_s=[1.0 + n / 10] * 3,
            host_steal_share_by_step=[0.0] * 3,
            host_probe_by_step_s=[0.01] * 3,
            host_probe_s=0.01,
            host_steal_share=0.0,
        )
        write_run(rec, runs)
        return load_run(runs / f"{rec.run_id}.json"), ""

    monkeypatch.setattr(measure, "run_config", fake_measure)
    return calls


def _validate(tmp_path: Path, *extra: str) -> int:
    m = write(tmp_path, "m.yaml", MATRIX)
    prof = str(_profile(tmp_path))
    return run_cli_(["validate", "--matrix", str(m), "--out", str(tmp_path / "out"), "--profile", prof, *extra])


def test_a_torn_validation_json_is_rebuilt_from_its_runs(tmp_path, real_records, capsys):
    assert _validate(tmp_path) == 0
    out = tmp_path / "out"
    before = {r["label"]: r for r in json.loads((out / "validation.json").read_text())["rows"]}
    torn = (out / "validation.json").read_text()[:300]
    (out / "validation.json").write_text(torn)
    real_records.clear()
    capsys.readouterr()
    assert _validate(tmp_path) == 0
    assert real_records == []  # nothing run again
    err = capsys.readouterr().err
    assert "validation.json: not valid JSON (line" in err and "rebuilt 3 configuration(s) from the 3 run(s)" in err
    assert (out / "validation.json.corrupt").read_text() == torn  # the torn file kept, not discarded
    after = {r["label"]: r for r in json.loads((out / "validation.json").read_text())["rows"]}
    for label, row in before.items():
        for key in ("measured_s", "step_times_s", "run_ids", "status", "predicted_s", "steps_kept"):
            assert after[label][key] == row[key], (label, key)


def test_a_torn_validation_json_without_runs_is_named_not_read_as_empty(tmp_path, real_records, capsys):
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "validation.json").write_text('{"rows": [{"topology": "emu-2x2", "con')
    assert _validate(tmp_path) == 2
    err = one_line(capsys.readouterr().err)
    assert f"{out / 'validation.json'}: not valid JSON (line 1" in err and "no run to rebuild it from" in err
    assert real_records == [] and (out / "validation.json").read_text().endswith('"con')  # nothing run or replaced


def test_a_validation_json_of_mistyped_rows_is_corrupt():
    from shardsim.runtime.validation.resume import read_rows

    key = {"topology": "emu-2x2", "nodes": 2, "world": 4, "device": "cpu", "workload": "small-gpt", "label": "ddp"}
    strategy = {
        "kind": "ddp",
        "degree": "x",
        "pp": 1,
        "microbatches": 1,
        "schedule": None,
        "reshard_after_forward": None,
    }
    with pytest.raises(CorruptFile, match=r"field 'rows\[0\].strategy.degree': expected a whole number, got 'x'"):
        read_rows_of({"rows": [key | {"strategy": strategy}]}, read_rows)
    # a row written before the key: its loose fields are read in the key's form, and checked there
    with pytest.raises(CorruptFile, match=r"field 'rows\[0\].status': expected a string, got 3"):
        old = {"topology": "emu-2x2", "config": "ddp", "strategy": "ddp", "degree": 1, "pp": 1, "microbatches": 1}
        read_rows_of({"rows": [old | {"schedule": "1f1b", "world": 4, "status": 3}]}, read_rows)


def read_rows_of(doc: dict, read_rows) -> list:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d, "validation.json")
        p.write_text(json.dumps(doc))
        return read_rows(p)


def test_a_torn_run_json_is_named_before_anything_runs(tmp_path, real_records, capsys):
    assert _validate(tmp_path) == 0
    run = sorted((tmp_path / "out" / "runs").glob("*.json"))[1]
    run.write_text(run.read_text()[:200])
    real_records.clear()
    capsys.readouterr()
    assert _validate(tmp_path) == 2
    err = one_line(capsys.readouterr().err)
    assert f"{run}: not valid JSON (line" in err and real_records == []


def test_a_torn_runs_csv_is_named_by_validate_and_by_run(tmp_path, real_records, capsys, monkeypatch):
    assert _validate(tmp_path) == 0
    runs_csv = tmp_path / "out" / "runs" / CSV_NAME
    text = runs_csv.read_text()
    runs_csv.write_text(text[: text.rindex(",") - 5])  # the last row torn
    real_records.clear()
    capsys.readouterr()
    assert _validate(tmp_path) == 2
    assert "runs.csv line 4: no line end" in one_line(capsys.readouterr().err)

    monkeypatch.setattr(run_cli, "run_planned", lambda *a, **k: pytest.fail("the run started"))
    argv = ["run", "--topology", "emu-2x2", "--workload", "tiny-gpt", "--no-emulate", "--nproc", "2"]
    assert run_cli_([*argv, "--out", str(runs_csv.parent)]) == 2
    assert f"{runs_csv} line 4: no line end" in one_line(capsys.readouterr().err)


def test_write_run_never_rewrites_a_torn_runs_csv(tmp_path):
    write_run(run_record(run_id="a"), tmp_path)
    torn = (tmp_path / CSV_NAME).read_text()[:-40]
    (tmp_path / CSV_NAME).write_text(torn)
    with pytest.raises(CorruptFile, match="runs.csv line 2: no line end"):
        write_run(run_record(run_id="b"), tmp_path)
    assert (tmp_path / CSV_NAME).read_text() == torn and load_run(tmp_path / "b.json").run_id == "b"
    for bad, why in [
        ("run_id,x\n1,2,3\n", "line 2: 3 cells; the header has 2 columns"),
        ("hello\n", "no run_id column"),
        (b"run_id\n\xff\xfe\n", "not UTF-8"),
    ]:
        (tmp_path / CSV_NAME).write_bytes(bad if isinstance(bad, bytes) else bad.encode())
        with pytest.raises(CorruptFile, match=why):
            check_runs_csv(tmp_path)


def test_a_run_json_is_checked_field_by_field(tmp_path):
    path = write_run(run_record(run_id="r"), tmp_path)
    doc = json.loads(path.read_text())
    for change, why in [
        ({"step_times_s": "fast"}, "field 'step_times_s': expected a list"),
        ({"world": "4"}, "field 'world': expected a whole number"),
        ({"colour": 1}, "unknown key 'colour'"),
    ]:
        path.write_text(json.dumps(doc | change))
        with pytest.raises(CorruptFile, match=why) as err:
            load_run(path)
        assert str(path) in str(err.value)
    path.write_text(json.dumps({k: v for k, v in doc.items() if k != "loss_last"}))
    with pytest.raises(ValueError, match="loss_last"):
        load_run(path)


def test_validates_own_torn_profile_is_named_not_measured_again(tmp_path, real_records, capsys, monkeypatch):
    import shardsim.runtime.profile as profiling

    monkeypatch.setattr(profiling, "build_profile", lambda *a, **k: pytest.fail("measured again"))
    out = tmp_path / "out"
    out.mkdir()
    torn = _profile(tmp_path).read_text()[:150]
    (out / "profile.json").write_text(torn)
    m = write(tmp_path, "m.yaml", MATRIX)
    assert run_cli_(["validate", "--matrix", str(m), "--out", str(out)]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"{out / 'profile.json'}: not valid JSON (line" in err and "move it aside" in err
    assert (out / "profile.json").read_text() == torn and real_records == []


def test_rebuilt_rows_take_every_attempt_of_their_configuration_only():
    m = load_matrix(None)
    zero = [run_record(run_id=f"z{i}", finished_at=f"2026-01-01T00:00:0{i}+00:00", step_times_s=[float(i)] * 3)
            for i in (2, 1)]  # fmt: skip
    other = run_record(run_id="o", workload="tiny-gpt")  # another workload's run of the same label
    rows = rebuild_rows(m, [*zero, other])
    assert [r.key for r in rows] == [("emu-2x2", "zero")]
    assert rows[0].run_ids == ["z1", "z2"] and rows[0].attempts == 2 and rows[0].status == "ok"


def test_rebuilt_rows_match_records_by_their_world_whatever_nodes_their_run_was_given():
    m = load_matrix(None)  # emu-2x2: 4 ranks
    full = run_record(run_id="full", nodes=None)  # `shardsim run` without --nodes
    flagged = run_record(run_id="flagged", nodes=2)
    half = run_record(run_id="half", nodes=None, world=2, nproc_per_node=2)  # --nproc 2 --no-emulate
    rows = rebuild_rows(m, [full, flagged, half])
    assert [(r.key, r.run_ids) for r in rows] == [(("emu-2x2", "zero"), ["flagged", "full"])]


def test_runs_csv_has_the_std_column_and_older_files_are_kept(tmp_path):
    old_columns = [c for c in read_runs_csv_columns(tmp_path) if c != "step_time_std_s"]
    with open(tmp_path / CSV_NAME, "w", newline="") as f:  # a runs.csv from before the column
        w = csv.DictWriter(f, fieldnames=old_columns)
        w.writeheader()
        w.writerow(dict.fromkeys(old_columns, "1") | {"run_id": "old"})
    write_run(run_record(run_id="new", step_time_std_s=0.25), tmp_path)
    header, rows = read_runs_csv(tmp_path / CSV_NAME)
    assert "step_time_std_s" in header
    assert [(r["run_id"], r["step_time_std_s"]) for r in rows] == [("old", ""), ("new", "0.25")]


def read_runs_csv_columns(tmp_path: Path) -> list[str]:
    d = tmp_path / "fresh"
    write_run(run_record(run_id="x"), d)
    return read_runs_csv(d / CSV_NAME)[0]


def test_run_records_and_sweep_outputs_share_one_mode(tmp_path):
    import pandas as pd

    from shardsim.core.files import file_mode
    from shardsim.sweep.output import write_tables

    record = write_run(run_record(run_id="m"), tmp_path / "runs")
    tables = write_tables(pd.DataFrame({"a": [1]}), tmp_path)
    modes = {oct(os.stat(p).st_mode & 0o777) for p in [record, tmp_path / "runs" / CSV_NAME, *tables]}
    assert modes == {oct(file_mode())}


def test_a_runs_csv_shared_by_symlinks_gets_every_row_and_stays_shared(tmp_path):
    """Two output folders whose runs.csv links to one team file: the rows go into that file,
    its owner and mode stay, and writers through either link take one lock, the file's own."""
    import stat
    import threading

    from shardsim.core.lockfile import acquire, release

    team = tmp_path / "team"
    write_run(run_record(run_id="first"), team)
    shared = team / CSV_NAME
    os.chown(shared, 4242, 4242)
    os.chmod(shared, 0o666)
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / CSV_NAME).symlink_to(shared)
    write_run(run_record(run_id="via-a"), a)
    lock = team / f".{CSV_NAME}.lock"
    fd = acquire(lock, blocking=False)  # another writer holds the team file's lock
    assert fd is not None
    writer = threading.Thread(target=write_run, args=(run_record(run_id="via-b"), b), daemon=True)
    writer.start()
    writer.join(0.5)
    waited = writer.is_alive()
    release(lock, fd)
    writer.join(10)
    assert waited, "a writer through the other link did not wait for the file's lock"
    assert (a / CSV_NAME).is_symlink() and (b / CSV_NAME).is_symlink()
    assert [r["run_id"] for r in read_runs_csv(shared)[1]] == ["first", "via-a", "via-b"]
    st = os.stat(shared)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o666, 4242, 4242)


def test_a_run_whose_files_cannot_be_written_names_what_was_written(tmp_path):
    """runs.csv on a full device (a private /dev/full): the record is written, the row is not;
    the record's own path full: nothing is written. Never the device read as a runs.csv."""
    import stat

    from shardsim.core.errors import WriteError

    full = private_device(tmp_path / "full")
    out = tmp_path / "out"
    out.mkdir()
    (out / CSV_NAME).symlink_to(full)
    check_runs_csv(out)  # a device is written to, never read (it has no end)
    with pytest.raises(WriteError) as info:
        write_run(run_record(run_id="r"), out)
    assert str(info.value) == f"cannot write {out / CSV_NAME}: No space left on device; written: r.json"
    assert load_run(out / "r.json").run_id == "r" and stat.S_ISCHR(os.stat(out / CSV_NAME).st_mode)
    (out / "s.json").symlink_to(full)
    with pytest.raises(WriteError) as info:
        write_run(run_record(run_id="s"), out)
    assert str(info.value) == (
        f"cannot write {out / 's.json'}: No space left on device; written: nothing; not written: its row of runs.csv"
    )


@pytest.mark.parametrize("kind", ["folder", "device"])
def test_a_validation_json_or_run_record_that_is_not_a_file_is_corrupt(tmp_path, kind):
    from shardsim.runtime.validation.resume import read_rows

    for path, read in ((tmp_path / "validation.json", read_rows), (tmp_path / "run.json", load_run)):
        if kind == "folder":
            path.mkdir()
        else:
            path.symlink_to("/dev/zero")  # read at most the bound, then named
        with pytest.raises(CorruptFile) as err:
            read(path)
        assert err.value.where == str(path), err.value
