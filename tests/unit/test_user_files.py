"""Files the user passes (a profile, a validation matrix, a calibration file) are checked against
their schemas: a wrongly typed field is one line naming the file and the field, exit 2, in
predict, sweep and validate alike; and output paths are checked before any work."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardsim.cli import main
from shardsim.core.documents import field_name
from tests.unit.test_validation import PROFILE, _profile, write

PREDICT = ["predict", "--workload", "small-gpt", "--topology", "emu-2x2", "--backend", "gloo"]
SWEEP = ["sweep", "--workload", "small-gpt", "--topology", "emu-2x2", "--backend", "gloo", "--workers", "1"]


def cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardsim: error: "), err
    return err


MISTYPED_PROFILES = {
    "host": ({"host": "x"}, "field 'host': expected a mapping, got 'x'"),
    "links": ({"links": [{"nic_Bps": 1}]}, "field 'links': expected a mapping, got [{'nic_Bps': 1}]"),
    "link": ({"links": {"emu-2x2": "fast"}}, "field 'links.emu-2x2': expected a mapping"),
    "cores": ({"host": {"effective_cores": {"4": "2"}}}, "field 'host.effective_cores.4': expected a number"),
    "fsdp": ({"fsdp_overhead_s": [0.1, 0.2]}, "field 'fsdp_overhead_s': expected a mapping"),
    "block": ({"blocks_by_batch_s": {"4": {"embed": [0.1, "x"]}}}, "field 'blocks_by_batch_s.4.embed[1]'"),
    "batch": ({"blocks_by_batch_s": {"four": {"embed": [0.1, 0.2]}}}, "field 'blocks_by_batch_s.four'"),
    "bool": ({"probe_s": True}, "field 'probe_s': expected a number, got True"),
}


@pytest.mark.parametrize("case", MISTYPED_PROFILES, ids=list(MISTYPED_PROFILES))
def test_a_mistyped_profile_is_one_line_in_predict_sweep_and_validate(tmp_path, capsys, case):
    change, needle = MISTYPED_PROFILES[case]
    doc = json.loads(_profile(tmp_path).read_text()) | change
    path = write(tmp_path, "bad.json", json.dumps(doc))
    matrix = write(tmp_path, "m.yaml", "workload: small-gpt\ntopologies: {emu-2x2: [ddp]}\n")
    out = tmp_path / "out"
    for argv in (
        [*PREDICT, "--profile", str(path)],
        [*SWEEP, "--profile", str(path)],
        ["validate", "--matrix", str(matrix), "--out", str(out), "--profile", str(path)],
    ):
        assert cli(argv) == 2, argv[0]
        err = one_line(capsys)
        assert f"{path}: {needle}" in err, (argv[0], err)
    assert not (out / "validation.json").exists()


def test_a_torn_profile_is_one_line(tmp_path, capsys):
    path = write(tmp_path, "p.json", json.dumps(PROFILE)[:60])
    assert cli([*PREDICT, "--profile", str(path)]) == 2
    assert f"{path}: not valid JSON (line 1" in one_line(capsys)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("timeout: .inf\n", "field 'timeout': expected a finite number, got inf"),
        ("timeout: .nan\n", "field 'timeout': expected a finite number, got nan"),
        ("steps: '3'\n", "field 'steps': expected a whole number from 1 to 100,000, got '3'"),
        ("retries: 1.5\n", "field 'retries': expected a whole number from 0 to 100, got 1.5"),
        ("max_steal: [0.2]\n", "field 'max_steal': expected a part of the cores' time, 0 < max_steal <= 1, got [0.2]"),
        ("description: [a, b]\n", "field 'description': expected a string"),
        ("batch_per_device: x\n", "field 'batch_per_device': expected an integer, got 'x'"),
    ],
    ids=["inf", "nan", "steps", "retries", "max-steal", "description", "batch"],
)
def test_a_mistyped_matrix_is_one_line(tmp_path, capsys, text, needle):
    path = write(tmp_path, "m.yaml", text + "topologies: {emu-2x2: [ddp]}\n")
    out = tmp_path / "out"
    assert cli(["validate", "--matrix", str(path), "--out", str(out)]) == 2
    err = one_line(capsys)
    assert str(path) in err and needle in err, err
    assert not (out / "profile.json").exists()


CALIBRATION = """device: NVIDIA A100 SXM4 40GB
topology: a100-40gb-roce
parameters:
  kernel_floor_us: {value: 20.0, default: 35.0, low: 2.0, high: 100.0}
"""


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ("fitted_to: [1, 2]\n", "field 'fitted_to': expected a mapping, got [1, 2]"),
        ("errors: 3\n", "field 'errors': expected a mapping, got 3"),
        ("comment: hi\n", "field 'comment': unknown key"),
    ],
    ids=["fitted-to", "errors", "unknown"],
)
def test_a_mistyped_calibration_is_one_line(tmp_path, capsys, monkeypatch, change, needle):
    import shardsim.runtime.profile as profiling

    monkeypatch.setattr(profiling, "build_profile", lambda *a, **k: pytest.fail("profiled before the calibration"))
    path = write(tmp_path, "cal.yaml", CALIBRATION + change)
    argv = ["predict", "--topology", "a100-40gb-roce", "--nodes", "1", "--calibration", str(path)]
    matrix = write(tmp_path, "m.yaml", "workload: small-gpt\ntopologies: {emu-2x2: [ddp]}\n")
    for run in (
        argv,
        ["sweep", "--topology", "a100-40gb-roce", "--nodes", "1", "--workers", "1", "--calibration", str(path)],
        ["validate", "--matrix", str(matrix), "--out", str(tmp_path / "out"), "--calibration", str(path)],
    ):
        assert cli(run) == 2, run[0]
        err = one_line(capsys)
        assert f"{path}: {needle}" in err, err
    bad_value = write(tmp_path, "v.yaml", CALIBRATION.replace("value: 20.0", "value: fast"))
    assert cli([*argv[:-1], str(bad_value)]) == 2
    assert "field 'parameters.kernel_floor_us.value': expected a number, got 'fast'" in one_line(capsys)


def test_field_names_read_as_the_file_does():
    assert field_name(("links", "emu-2x2", "nic_Bps")) == "links.emu-2x2.nic_Bps"
    assert field_name(("blocks", "4", "embed", 1)) == "blocks.4.embed[1]"
    assert field_name(("topologies", 5, "[key]")) == "topologies.5"
    assert field_name(()) == ""


@pytest.mark.parametrize("target", ["file/trace.json", "folder", "."], ids=["under-a-file", "folder", "dot"])
def test_a_trace_path_that_cannot_be_written_is_refused_before_predicting(tmp_path, capsys, monkeypatch, target):
    import shardsim.simulator.predict as predict

    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(predict, "predict", lambda *a, **k: pytest.fail("predicted before checking --trace"))
    assert cli(["predict", "--trace", target]) == 2
    err = one_line(capsys)
    assert f"{target}: field 'trace': " in err
    assert sorted(os.listdir(tmp_path)) == ["file", "folder"] and os.listdir(tmp_path / "folder") == []  # nothing left


def test_a_trace_is_written_where_asked(tmp_path, capsys):
    assert cli(["predict", "--trace", str(tmp_path / "t.json")]) == 0
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert os.listdir(tmp_path) == ["t.json"]


def test_file_outputs_of_calibrate_and_profile_are_checked_before_work(tmp_path, capsys, monkeypatch):
    import shardsim.cli.profile as profile_cli

    monkeypatch.setattr(profile_cli, "build_profile", lambda *a, **k: pytest.fail("profiled before checking --out"))
    blocker = write(tmp_path, "file", "")
    argv = ["profile", "--workload", "tiny-gpt", "--topology", "emu-2x2", "--backend", "gloo", "--no-links"]
    assert cli([*argv, "--out", str(blocker / "p.json")]) == 2
    assert "field 'out': cannot make its folder" in one_line(capsys)
    assert cli([*argv, "--out", str(tmp_path)]) == 2
    assert "field 'out': is a folder; expected a file path" in one_line(capsys)
    measured = write(tmp_path, "m.csv", "workload,step_time_s\ngpt2-xl,1.0\n")
    assert cli(["calibrate", str(measured), "--topology", "a100-40gb-roce", "--out", str(blocker / "c.yaml")]) == 2
    err = one_line(capsys)
    assert f"{blocker / 'c.yaml'}: field 'out': cannot make its folder" in err and "is not a folder" in err
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["file", "m.csv"]
