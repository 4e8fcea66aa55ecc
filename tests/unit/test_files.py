"""The one atomic-write helper: old or new file, never a torn one, no temporary left."""

import os
import stat

import pytest

from shardsim.simulator.errors import ConfigError
from shardsim.simulator.files import (
    FILE_MODE,
    atomic_path,
    atomic_write,
    check_output_dir,
    check_output_file,
    file_mode,
)


def test_atomic_write_replaces_and_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    atomic_write(target, "new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(os.stat(target).st_mode) == file_mode()
    assert os.listdir(tmp_path) == ["out.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash while writing")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.json"]


def test_bytes_are_written_as_given(tmp_path):
    atomic_write(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"


@pytest.mark.parametrize("step", ["fsync", "chmod", "replace"])
def test_a_failure_at_any_step_after_the_write_leaves_no_temporary(tmp_path, monkeypatch, step):
    target = tmp_path / "out.json"
    target.write_text("old")

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, step, fail)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.json"]


def test_a_folder_or_a_missing_folder_as_target_creates_nothing(tmp_path):
    (tmp_path / "sub").mkdir()
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path / "sub", "x")
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "missing" / "x.json", "x")
    assert os.listdir(tmp_path) == ["sub"] and os.listdir(tmp_path / "sub") == []


def test_an_interrupt_while_writing_leaves_no_temporary(tmp_path):
    with pytest.raises(KeyboardInterrupt), atomic_path(tmp_path / "out.json") as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_get_0644_less_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        atomic_write(tmp_path / "f", "x")
        assert file_mode() == FILE_MODE & ~umask
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == FILE_MODE & ~umask


def test_output_paths_are_checked(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "file").write_text("")
    assert check_output_file(tmp_path / "a.json", "out") == tmp_path / "a.json"
    for path, why in [
        (tmp_path / "sub", "is a folder"),
        (tmp_path / "no" / "a.json", "its folder .* does not exist"),
        (tmp_path / "file" / "a.json", "its folder .* is not a folder"),
    ]:
        with pytest.raises(ConfigError, match=f"field 'out': {why}"):
            check_output_file(path, "out")
    assert check_output_file(tmp_path / "made" / "a.json", "out", make_folder=True).parent.is_dir()
    assert check_output_dir(tmp_path / "d" / "e", "out").is_dir()
    with pytest.raises(ConfigError, match="is a file; expected a folder"):
        check_output_dir(tmp_path / "file", "out")
    with pytest.raises(ConfigError, match="cannot make the folder"):
        check_output_dir(tmp_path / "file" / "x", "out")
    assert sorted(os.listdir(tmp_path)) == ["d", "file", "made", "sub"]  # the checks leave nothing behind


def test_a_folder_nobody_can_write_in_is_refused():
    """/proc takes no new files, root's included (a mode-0555 folder would not stop root)."""
    with pytest.raises(ConfigError, match="field 'out': not writable"):
        check_output_file("/proc/a.json", "out")
    with pytest.raises(ConfigError, match="field 'out': cannot"):
        check_output_dir("/proc/shardsim-out", "out")
