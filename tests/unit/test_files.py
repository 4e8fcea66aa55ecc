"""The one atomic-write helper: old or new file, never a torn one, no temporary left."""

import os
import stat

import pytest

from shardsim.simulator.files import FILE_MODE, atomic_path, atomic_write


def test_atomic_write_replaces_and_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    atomic_write(target, "new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(os.stat(target).st_mode) == FILE_MODE
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
