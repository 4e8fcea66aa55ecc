"""One --out folder holds one sweep: a second sweep into a folder another holds is refused in one
line naming the holder, before any prediction; a sweep's files replace those the earlier sweep's
manifest lists, and the manifest says what was written and by which command; a sweep that fails
before its files are in leaves the earlier ones whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardsim.cli import main
from shardsim.core.errors import CorruptFile
from shardsim.core.lockfile import held
from shardsim.sweep import search
from shardsim.sweep.output import LOCK, MANIFEST, publish

SMALL = ["sweep", "--workload", "tiny-gpt", "--topology", "emu-2x2", "--backend", "gloo", "--strategies", "ddp,zero",
         "--workers", "1", "--no-progress"]  # fmt: skip


def test_a_second_sweep_into_a_held_folder_is_refused_naming_the_holder(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(search, "predict_all", lambda *a, **k: pytest.fail("a prediction ran"))
    with held(out / LOCK, "pid 4242 (shardsim sweep --out out) since 2026-01-01 00:00:00"):
        assert main([*SMALL, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardsim: error: field '--out': "), err
    assert (
        f"{out} is being written by another sweep, pid 4242 (shardsim sweep --out out) since 2026-01-01 00:00:00; "
        in err
    )
    assert os.listdir(out) == []  # nothing written, and the holder's lock is gone with it


def test_a_sweep_replaces_the_files_its_predecessor_listed_and_keeps_the_others(tmp_path, capsys):
    out = tmp_path / "out"
    first = [*SMALL, "--nodes", "1,2", "--out", str(out)]
    assert main(first) == 0
    assert {"scaling.png", "sweep.csv", MANIFEST} <= set(os.listdir(out))
    (out / "notes.txt").write_text("mine")
    second = [*SMALL, "--nodes", "1", "--no-plots", "--out", str(out)]
    assert main(second) == 0
    assert sorted(os.listdir(out)) == sorted(["notes.txt", "sweep.csv", "sweep.parquet", "recommended.json", MANIFEST])
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["command"] == "shardsim " + " ".join(second)
    assert sorted(manifest["files"]) == ["recommended.json", "sweep.csv", "sweep.parquet"]
    assert f"Wrote 4 files to {out}" in capsys.readouterr().out


def test_a_sweep_that_fails_making_its_files_leaves_the_earlier_ones_whole(tmp_path):
    out = tmp_path
    publish(out, "first", lambda folder: [_file(folder / "a.csv", "1"), _file(folder / "b.png", "1")])

    def failing(folder: Path) -> list[Path]:
        _file(folder / "a.csv", "2")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        publish(out, "second", failing)
    assert sorted(os.listdir(out)) == ["a.csv", "b.png", MANIFEST] and (out / "a.csv").read_text() == "1"
    assert json.loads((out / MANIFEST).read_text())["command"] == "first"


@pytest.mark.parametrize("listed", [["../victim.txt"], ["/etc/hostname"], [".shardsim-sweep.lock"], "sweep.csv"])
def test_a_manifest_that_lists_anything_but_the_folders_files_is_named_and_nothing_removed(tmp_path, listed):
    out = tmp_path / "out"
    out.mkdir()
    victim = _file(tmp_path / "victim.txt", "keep")
    (out / MANIFEST).write_text(json.dumps({"command": "x", "files": listed}))
    with pytest.raises(CorruptFile, match="move it aside") as err:
        publish(out, "y", lambda folder: pytest.fail("files made"))
    assert err.value.where == str(out / MANIFEST) and victim.read_text() == "keep"
    assert sorted(os.listdir(out)) == [MANIFEST]


@pytest.mark.parametrize("kind", ["folder", "device"])
def test_a_manifest_that_is_not_a_file_is_named_and_nothing_made(tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    if kind == "folder":
        (out / MANIFEST).mkdir()
    else:
        (out / MANIFEST).symlink_to("/dev/zero")
    with pytest.raises(CorruptFile, match="move it aside") as err:
        publish(out, "y", lambda folder: pytest.fail("files made"))
    assert err.value.where == str(out / MANIFEST)


def _file(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_sweep_writes_through_the_links_of_its_folder_and_keeps_their_owner_and_mode(tmp_path):
    """A file of the earlier sweep that is a link (a table shared elsewhere) stays a link: the new
    table goes into the file it leads to, which keeps its mode."""
    out, shared = tmp_path / "out", tmp_path / "shared.csv"
    out.mkdir()
    publish(out, "first", lambda folder: [_file(folder / "a.csv", "1")])
    (out / "a.csv").unlink()
    shared.write_text("old")
    shared.chmod(0o666)
    (out / "a.csv").symlink_to(shared)
    publish(out, "second", lambda folder: [_file(folder / "a.csv", "2")])
    assert (out / "a.csv").is_symlink() and shared.read_text() == "2"
    assert oct(shared.stat().st_mode & 0o777) == oct(0o666)
