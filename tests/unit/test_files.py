"""The one atomic-write helper: old or new file, never a torn one, no temporary left."""

import contextlib
import errno
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shardsim.core.errors import ConfigError
from shardsim.core.files import (
    FILE_MODE,
    WriteError,
    atomic_path,
    atomic_write,
    check_output_dir,
    check_output_file,
    file_mode,
    output_folder,
    recorded,
)
from tests.helpers import private_device


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


def test_a_folder_as_target_creates_nothing(tmp_path):
    (tmp_path / "sub").mkdir()
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path / "sub", "x")
    assert os.listdir(tmp_path) == ["sub"] and os.listdir(tmp_path / "sub") == []


def test_a_missing_folder_is_made_and_removed_again_when_the_write_fails(tmp_path, monkeypatch):
    atomic_write(tmp_path / "a" / "b" / "x.json", "x")
    assert (tmp_path / "a" / "b" / "x.json").read_text() == "x"
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(WriteError, match=r"cannot write .*y\.json: No space left"):
        atomic_write(tmp_path / "c" / "d" / "y.json", "y")
    assert sorted(os.listdir(tmp_path)) == ["a"]  # c and d made, then removed: nothing written in them


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
        (tmp_path / "file" / "a.json", "cannot make its folder .* is not a folder"),
        (tmp_path / "file" / "x" / "a.json", "cannot make its folder .* is not a folder"),
    ]:
        with pytest.raises(ConfigError, match=f"field 'out': {why}"):
            check_output_file(path, "out")
    assert check_output_file(tmp_path / "no" / "a.json", "out") == tmp_path / "no" / "a.json"  # made when written
    assert check_output_dir(tmp_path / "d" / "e", "out") == tmp_path / "d" / "e"
    with pytest.raises(ConfigError, match="is a file; expected a folder"):
        check_output_dir(tmp_path / "file", "out")
    with pytest.raises(ConfigError, match="cannot make its folder"):
        check_output_dir(tmp_path / "file" / "x", "out")
    assert sorted(os.listdir(tmp_path)) == ["file", "sub"]  # the checks make nothing


def test_a_folder_nobody_can_write_in_is_refused():
    """/proc takes no new files, root's included (a mode-0555 folder would not stop root)."""
    with pytest.raises(ConfigError, match="field 'out': not writable"):
        check_output_file("/proc/a.json", "out")
    with pytest.raises(ConfigError, match="field 'out': cannot"):
        check_output_dir("/proc/shardsim-out", "out")


# Writes respect what is at the path: an existing file keeps its owner, group and mode; a symlink's
# target is written; devices, FIFOs and open descriptors (/dev/stdout) are written through.
# The tests run as root (here and in CI): chown to another uid and mknod need it.

OTHER_UID = 4242


def test_an_existing_file_keeps_its_owner_group_and_mode(tmp_path):
    shared = tmp_path / "runs.csv"
    shared.write_text("old")
    os.chown(shared, OTHER_UID, OTHER_UID)
    os.chmod(shared, 0o666)
    atomic_write(shared, "new")
    st = os.stat(shared)
    assert (shared.read_text(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == ("new", 0o666, OTHER_UID, OTHER_UID)
    private = tmp_path / "trace.json"
    private.write_text("old")
    os.chmod(private, 0o600)
    atomic_write(private, "new")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["runs.csv", "trace.json"]


def test_a_symlink_is_kept_and_its_target_written(tmp_path):
    (tmp_path / "team").mkdir()
    target = tmp_path / "team" / "runs.csv"
    target.write_text("old")
    os.chmod(target, 0o664)
    link = tmp_path / "runs.csv"
    link.symlink_to("team/runs.csv")  # relative, as a team shares one file
    chain = tmp_path / "again.csv"
    chain.symlink_to(link)
    atomic_write(chain, "new")
    assert chain.is_symlink() and link.is_symlink() and os.readlink(link) == "team/runs.csv"
    assert target.read_text() == "new" and stat.S_IMODE(os.stat(target).st_mode) == 0o664
    assert os.listdir(tmp_path / "team") == ["runs.csv"]  # the temporary lived next to the target
    dangling = tmp_path / "later.json"
    dangling.symlink_to(tmp_path / "team" / "later.json")
    atomic_write(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "team" / "later.json").read_text() == "made"


def test_a_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    atomic_write(fifo, "through the pipe")
    reader.join(timeout=10)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp_path) == ["fifo"]


def test_a_device_stays_a_device(tmp_path):
    null = private_device(tmp_path / "null", 1, 3)
    atomic_write(null, "gone")
    with atomic_path(null) as tmp:
        tmp.write_text("gone too")
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.listdir(tmp_path) == ["null"]


def test_a_full_device_fails_the_write_and_stays_a_device(tmp_path):
    full = private_device(tmp_path / "full", 1, 7)
    (tmp_path / "a.json").write_text("old")
    with recorded() as written, pytest.raises(WriteError) as info:
        atomic_write(tmp_path / "a.json", "new")
        atomic_write(full, "x" * 100_000)
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == f"cannot write {full}: No space left on device"
    assert written == [tmp_path / "a.json"]
    assert str(info.value.naming(["a.json"], ["b.json"])) == (
        f"cannot write {full}: No space left on device; written: a.json; not written: b.json"
    )
    assert stat.S_ISCHR(os.lstat(full).st_mode) and sorted(os.listdir(tmp_path)) == ["a.json", "full"]


WRITE_TO_STDOUT = """
import sys
from shardsim.core.files import atomic_write, check_output_file
print("before", flush=True)
check_output_file(sys.argv[1], "trace")
atomic_write(sys.argv[1], "written\\n")
print("after")
"""


@pytest.mark.parametrize("name", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
def test_dev_stdout_is_written_through_where_stdout_goes(tmp_path, name):
    """Redirected to a file, the write lands after what was printed (the same open file, not a
    new file renamed over it); piped, it goes down the pipe."""
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        proc = subprocess.run([sys.executable, "-c", WRITE_TO_STDOUT, name], stdout=f, stderr=subprocess.PIPE)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == "before\nwritten\nafter\n"
    piped = subprocess.run([sys.executable, "-c", WRITE_TO_STDOUT, name], capture_output=True, text=True)
    assert (piped.returncode, piped.stdout) == (0, "before\nwritten\nafter\n"), piped.stderr


def test_output_checks_accept_what_can_be_written_through(tmp_path):
    fifo, null = tmp_path / "fifo", private_device(tmp_path / "null", 1, 3)
    os.mkfifo(fifo)
    (tmp_path / "team").mkdir()
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "team" / "x.json")
    for path in (fifo, null, link, "/dev/stdout", "/dev/stderr"):
        assert check_output_file(path, "trace") == Path(path)
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link.json", "null", "team"]
    assert os.listdir(tmp_path / "team") == []
    folder_link = tmp_path / "results"
    folder_link.symlink_to(tmp_path / "team" / "results")  # a link to a folder still to be made
    assert check_output_dir(folder_link, "out") == folder_link
    assert not (tmp_path / "team" / "results").exists()  # checked, not made
    with output_folder(folder_link, "out") as made:
        atomic_write(made / "f", "x")
    assert (tmp_path / "team" / "results").is_dir() and folder_link.is_symlink()


@pytest.mark.parametrize("fails", [False, True])
def test_an_output_folder_made_and_left_empty_is_removed_one_written_in_is_kept(tmp_path, fails):
    (tmp_path / "there").mkdir()
    for name, write in (("empty", False), ("full", True)):
        folder = tmp_path / "there" / name / "deep"
        with contextlib.suppress(RuntimeError), output_folder(folder, "out") as made:
            assert made.is_dir()
            if write:
                atomic_write(made / "f", "x")
            if fails:
                raise RuntimeError("the command failed")
    assert sorted(os.listdir(tmp_path / "there")) == ["full"]  # a folder that was there stays
    assert (tmp_path / "there" / "full" / "deep" / "f").read_text() == "x"
