"""A command's outputs: never one of its inputs (the same file however it is reached), refused in
one line before any work; a sweep's --out folder of other files refused unless --force, a corrupt
manifest before the sweep starts; an output that cannot be written for want of room (the disk
full, /dev/full) is one line naming the write, status 1, and leaves no folder it made; a missing
folder of any output is made."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardsim.api  # noqa: F401 - each binds predict by name: imported before a test patches it
import shardsim.core.lockfile as lockfile
import shardsim.simulator.calibration.band  # noqa: F401
import shardsim.simulator.calibration.fit  # noqa: F401
import shardsim.sweep.execute  # noqa: F401
from shardsim.core.files import same_file
from shardsim.sweep import search
from shardsim.sweep.output import MANIFEST
from tests.unit import test_user_files as user_files
from tests.unit.test_user_files import one_line

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "experiments" / "seed" / "zero.yaml"
MEASURED = ROOT / "docs" / "examples" / "calibration-3-rows.csv"
NCCL = ROOT / "experiments" / "calibration" / "data" / "nccl-all-reduce-p5-2node.csv"
P5_2 = ["--topology", "p5.48xlarge", "--nodes", "2"]  # the cluster the nccl-tests file was measured on
MATRIX = ROOT / "shardsim" / "data" / "matrices" / "ci.yaml"
TINY = ["--workload", "tiny-gpt", "--topology", "emu-2x2", "--backend", "gloo"]
# exhaustive: every prediction goes through `search.predict_all`, which `_predictions` counts
SWEEP = ["sweep", *TINY, "--strategies", "ddp,zero", "--workers", "1", "--no-progress", "--no-plots", "--exhaustive"]


def cli(argv: list) -> int:
    """The command's exit status, its arguments paths or text."""
    return user_files.cli([str(a) for a in argv])


def _copy(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def _no_work(monkeypatch) -> None:
    """Every command's work fails the test: the refusal must come before it."""
    import shardsim.cli.profile as profile_cli
    import shardsim.cli.run as run_cli
    import shardsim.cli.validate as validate_cli
    import shardsim.simulator.calibration.calibrate as calibrate
    import shardsim.simulator.collective as collective
    import shardsim.simulator.predict as predict

    def fail(*a, **k):
        pytest.fail("the command worked before refusing its output")

    monkeypatch.setattr(predict, "predict", fail)
    monkeypatch.setattr(calibrate, "calibrate", fail)
    monkeypatch.setattr(collective, "compare_collective", fail)
    monkeypatch.setattr(search, "predict_all", fail)
    monkeypatch.setattr(profile_cli, "build_profile", fail)
    monkeypatch.setattr(run_cli, "run_planned", fail)
    monkeypatch.setattr(validate_cli, "validate", fail)


def _reach(how: str, path: Path, tmp_path: Path) -> Path:
    """Another name of the file `path`: itself, a relative spelling, a symlink or a hard link."""
    if how == "same":
        return path
    if how == "relative":
        return Path(os.path.relpath(path.parent, Path.cwd())) / ".." / path.parent.name / path.name
    other = tmp_path / f"other-{how}{path.suffix}"
    if how == "symlink":
        other.symlink_to(path)
    else:
        os.link(path, other)
    return other


# each: the command's arguments, given the input file (made in tmp_path) and the output path
COMMANDS = {
    "predict --trace = config": (SEED, lambda i, o: ["predict", i, "--trace", o]),
    "predict --trace = workload": (
        ROOT / "shardsim" / "data" / "models" / "tiny-gpt.yaml",
        lambda i, o: ["predict", "--workload", i, "--trace", o],
    ),
    "calibrate --out = measured": (
        MEASURED,
        lambda i, o: ["calibrate", i, "--topology", "a100-40gb-roce", "--folds", "0", "--out", o],
    ),
    "calibrate --out = nccl-tests": (
        NCCL,
        lambda i, o: ["calibrate", "--nccl-tests", i, "--topology", "p5.48xlarge", "--nodes", "2", "--out", o],
    ),
    "collective --plot = --compare": (NCCL, lambda i, o: ["collective", *P5_2, "--compare", i, "--plot", o]),
    "profile --out = config": (SEED, lambda i, o: ["profile", i, *TINY, "--no-links", "--out", o]),
}


@pytest.mark.parametrize("how", ["same", "relative", "symlink", "hardlink"])
@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_that_is_an_input_is_refused_before_any_work(tmp_path, capsys, monkeypatch, command, how):
    monkeypatch.chdir(tmp_path)
    _no_work(monkeypatch)
    src, argv = COMMANDS[command]
    given_input = _copy(src, tmp_path / "in" / src.name)
    before = given_input.read_bytes()
    out = _reach(how, given_input, tmp_path)
    assert cli(argv(given_input, out)) == 2
    err = one_line(capsys)
    assert f"{out}: field '" in err and f"is an input of this command ({given_input})" in err
    assert given_input.read_bytes() == before


def test_a_sweep_that_would_replace_its_config_is_refused_before_any_prediction(tmp_path, capsys, monkeypatch):
    _no_work(monkeypatch)
    out = tmp_path / "out"
    for name in ("sweep.csv", "report.html", "notes.yaml"):  # files the sweep writes; one its predecessor listed
        config = _copy(SEED, out / name)
        (out / MANIFEST).write_text(json.dumps({"command": "x", "files": ["notes.yaml"]}))
        assert cli(["sweep", config, "--out", out]) == 2
        assert f"{out / name}: field '--out': is an input of this command ({config})" in one_line(capsys)
        assert config.read_bytes() == SEED.read_bytes()
        config.unlink()


def test_a_run_and_a_validation_that_would_replace_an_input_are_refused_before_any_work(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    _no_work(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    config = out / "runs.csv"
    config.write_text("strategy: ddp\n")
    assert cli(["run", config, *TINY, "--no-emulate", "--nproc", "2", "--out", out]) == 2
    assert f"field 'out': is an input of this command ({config})" in one_line(capsys)
    matrix = _copy(MATRIX, out / "validation.md")
    assert cli(["validate", "--matrix", matrix, "--out", out]) == 2
    assert f"{matrix}: field 'out': is an input of this command ({matrix})" in one_line(capsys)
    assert matrix.read_bytes() == MATRIX.read_bytes() and config.read_text() == "strategy: ddp\n"


@settings(max_examples=40, derandomize=True, deadline=None)
@given(
    st.lists(st.sampled_from([".", "sub/..", "link/..", "./sub/../."]), max_size=4),
    st.sampled_from(["f.yaml", "hard.yaml", "sym.yaml", "other.yaml", "missing.yaml"]),
)
def test_every_name_of_a_file_is_the_same_file_and_no_other_is(tmp_path_factory, parts, name):
    """Each spelling leads back to the folder (`link` leads to `sub`); a hard link and a symlink are
    the file, another file or a missing one is not."""
    base = tmp_path_factory.mktemp("names")
    (base / "sub").mkdir()
    (base / "link").symlink_to(base / "sub")
    target = base / "f.yaml"
    target.write_text("x")
    os.link(target, base / "hard.yaml")
    (base / "sym.yaml").symlink_to(target)
    (base / "other.yaml").write_text("x")
    assert same_file(base.joinpath(*parts, name), target) is (name in ("f.yaml", "hard.yaml", "sym.yaml"))


def _predictions(monkeypatch) -> list[int]:
    """The batches of predictions the sweep runs (none when refused before it starts)."""
    ran: list[int] = []
    real = search.predict_all

    def counted(batch, *a, **k):
        ran.append(len(batch))
        return real(batch, *a, **k)

    monkeypatch.setattr(search, "predict_all", counted)
    return ran


def test_a_folder_of_other_files_is_refused_unless_forced(tmp_path, capsys, monkeypatch):
    ran = _predictions(monkeypatch)
    out = tmp_path / "d"
    out.mkdir()
    (out / "sweep.csv").write_text("mine")
    (out / "recommended.json").write_text("mine too")
    assert cli([*SWEEP, "--out", out]) == 2
    err = one_line(capsys)
    assert "holds files (recommended.json, sweep.csv) and no sweep manifest" in err and "--force" in err
    assert ran == [] and (out / "sweep.csv").read_text() == "mine" and len(os.listdir(out)) == 2
    assert cli([*SWEEP, "--out", out, "--force"]) == 0
    assert ran and (out / "sweep.csv").read_text().startswith("topology,")
    assert json.loads((out / MANIFEST).read_text())["files"] == ["sweep.csv", "sweep.parquet", "recommended.json"]


def test_an_empty_or_new_folder_needs_no_force_and_force_needs_out(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "new" / "deep"):
        assert cli([*SWEEP, "--out", out]) == 0
        assert (out / MANIFEST).is_file()
    capsys.readouterr()
    assert cli([*SWEEP, "--force"]) == 2
    assert "field 'force': --force lets --out write into a folder of other files: it needs --out" in one_line(capsys)


@pytest.mark.parametrize("manifest", ["{bad", '{"files": "sweep.csv"}', '{"files": ["../x"]}'])
def test_a_corrupt_manifest_is_refused_before_the_sweep_starts(tmp_path, capsys, monkeypatch, manifest):
    ran = _predictions(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST).write_text(manifest)
    assert cli([*SWEEP, "--out", out]) == 2
    assert f"{out / MANIFEST}: " in one_line(capsys) and ran == []
    (out / MANIFEST).write_text('{"files": []}')  # the same sweep into a sound folder predicts
    assert cli([*SWEEP, "--out", out]) == 0 and ran


def _full(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


class _FullLockDisk:
    """`os` for the lock file's module, on a disk with no room left: `failing` (making the file,
    or writing in it) fails."""

    def __init__(self, failing: str):
        self.failing = failing

    def __getattr__(self, name):
        return _full if name == self.failing else getattr(os, name)


@pytest.mark.parametrize("failing", ["open", "write"])
def test_a_sweep_on_a_full_disk_names_the_lock_file_and_leaves_no_folder(tmp_path, capsys, monkeypatch, failing):
    ran = _predictions(monkeypatch)
    monkeypatch.setattr(lockfile, "os", _FullLockDisk(failing))
    out = tmp_path / "new" / "out"
    assert cli([*SWEEP, "--out", out]) == 1
    err = one_line(capsys)
    assert err == f"shardsim: error: cannot write {out / '.shardsim-sweep.lock'}: No space left on device\n"
    assert ran == [] and os.listdir(tmp_path) == []


def test_stdout_on_a_full_device_is_one_line_naming_it(capsys, monkeypatch):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    full = open("/dev/full", "w")  # noqa: SIM115 - closed below, its unwritable buffer dropped
    try:
        monkeypatch.setattr("sys.stdout", full)
        assert cli(["predict", "--json"]) == 1
    finally:
        monkeypatch.undo()
        with contextlib.suppress(OSError):
            full.close()
    assert capsys.readouterr().err == "shardsim: error: cannot write stdout: No space left on device\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "--trace", "{out}"],
        ["calibrate", MEASURED, "--topology", "a100-40gb-roce", "--folds", "0", "--out", "{out}"],
        ["collective", *P5_2, "--compare", NCCL, "--plot", "{out}"],
    ],
    ids=["predict", "calibrate", "collective"],
)
def test_an_output_on_a_full_disk_is_one_line_and_leaves_no_folder(tmp_path, capsys, monkeypatch, argv):
    """A full disk at the rename that would put the file in place (the same way the last step of
    every atomic write fails): the folders made for it are removed, the file named."""
    out = tmp_path / "new" / "sub" / "file"
    monkeypatch.setattr(os, "replace", _full)
    assert cli([str(a).replace("{out}", str(out)) for a in argv]) == 1
    assert capsys.readouterr().err.endswith(f"shardsim: error: cannot write {out}: No space left on device\n")
    assert os.listdir(tmp_path) == []


def test_a_profile_on_a_full_device_is_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    import shardsim.cli.profile as profile_cli

    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    monkeypatch.setattr(profile_cli, "build_profile", lambda *a, **k: {"blocks_by_batch_s": {}})
    assert cli(["profile", *TINY, "--no-links", "--out", "/dev/full"]) == 1
    assert one_line(capsys) == "shardsim: error: cannot write /dev/full: No space left on device\n"


def test_every_file_output_makes_its_missing_folder(tmp_path, capsys):
    trace, plot = tmp_path / "a" / "b" / "t.json", tmp_path / "c" / "d" / "p.png"
    assert cli(["predict", "--trace", trace]) == 0
    assert cli(["collective", *P5_2, "--compare", NCCL, "--plot", plot]) == 0
    assert json.loads(trace.read_text())["traceEvents"] and plot.read_bytes().startswith(b"\x89PNG")
