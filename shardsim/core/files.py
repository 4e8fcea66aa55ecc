"""Writing files so that a reader never sees a torn one (`atomic_write`, `atomic_path`), and
checking an output path before any work is done for it (`check_output_file`, `check_output_dir`,
`check_not_input`).

Every output, a file or a folder, gets its missing folders made (parents too): a file's when it
is written, removed again when that write fails; a folder's by `output_folder`, removed again
when the command ends without anything written into them. An output is never one of the same
command's inputs (`check_not_input`: the same file however it is reached).

A write goes where the path leads and leaves what is there as it is (`write_target`):
- a regular file is replaced atomically (a temporary next to it, renamed over it) and keeps its
  owner, group and mode; a new file gets mode `FILE_MODE` less the process' umask: 0644 under
  the usual umask 022 (the owner writes, everyone reads), narrower where the user's umask says so;
- a symlink stays a link: the file it leads to is written as above;
- a device, a FIFO or an open descriptor (``/dev/stdout``, ``/dev/fd/N``) is written through:
  opened and written in place, never renamed over.
Temporary files never outlive a failed write; a write that fails raises `WriteError`, naming
the file (and, in a command's own message, what else it wrote and what not: `recorded`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from shardsim.core.errors import ConfigError, WriteError

FILE_MODE = 0o644  # every file shardsim writes, before the umask: the owner writes, everyone reads
# a write that failed for want of room (a full disk, a quota, a file too large, a device that fails)
FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _umask() -> int:
    """The process' umask (read from /proc where it can be, so that it is never changed)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode shardsim gives the files it writes: `FILE_MODE` less the umask's bits."""
    return FILE_MODE & ~_umask()


# the names of this process' own descriptors: /dev/stdout, /dev/fd/1, /proc/self/fd/1
_DESCRIPTOR = re.compile(
    r"/dev/(?P<std>stdin|stdout|stderr)|/dev/fd/(?P<fd>\d+)|/proc/(?P<pid>self|\d+)/fd/(?P<pfd>\d+)"
)
_STANDARD = {"stdin": 0, "stdout": 1, "stderr": 2}


@dataclass(frozen=True)
class WriteTarget:
    """Where a write to a path lands: `path`, the path with its symlinks followed (a link's
    target, made if missing); `through` when that is a device, a FIFO or a socket, written in
    place; `fd` when the path names one of this process' open descriptors (``/dev/stdout``),
    written through that descriptor."""

    path: Path
    through: bool = False
    fd: int | None = None


def _descriptor(path: Path) -> int | None:
    """The descriptor of this process that `path` names (``/dev/stdout``, ``/dev/fd/N``,
    ``/proc/self/fd/N``, or a symlink leading to one of them); None for any other path."""
    p = Path(os.path.abspath(path))
    for _ in range(40):  # the kernel's own limit on links followed
        m = _DESCRIPTOR.fullmatch(str(p))
        if m and m["std"]:
            return _STANDARD[m["std"]]
        if m and (m["fd"] or m["pid"] in ("self", str(os.getpid()))):
            return int(m["fd"] or m["pfd"])
        if not p.is_symlink():
            return None
        p = Path(os.path.normpath(p.parent / os.readlink(p)))
    return None


def write_target(path: str | Path) -> WriteTarget:
    """Where a write to `path` lands (see `WriteTarget`)."""
    fd = _descriptor(Path(path))
    if fd is not None:
        return WriteTarget(Path(path), through=True, fd=fd)
    real = Path(os.path.realpath(path))
    try:
        mode = os.stat(real).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return WriteTarget(real)
    return WriteTarget(real, through=not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)))


def _keep_owner_and_mode(tmp: str, old: os.stat_result | None) -> None:
    """Give `tmp` the owner, group and mode of the file it replaces (`old`), as far as this
    process may (another user's file keeps its group where this user is in it, and its mode);
    a new file gets `file_mode()`."""
    if old is None:
        os.chmod(tmp, file_mode())
        return
    for uid, gid in ((old.st_uid, old.st_gid), (-1, old.st_gid)):
        try:
            os.chown(tmp, uid, gid)
            break
        except PermissionError:
            continue
    os.chmod(tmp, stat.S_IMODE(old.st_mode))


def _write_through(src: str, target: WriteTarget) -> None:
    """Copy the file `src` into `target` in place: into its open descriptor (stdout's buffer
    flushed first, so that what was printed comes before), else into the device or FIFO,
    opened for writing without creating or truncating anything."""
    with open(src, "rb") as data:
        if target.fd is not None:
            for stream in (sys.stdout, sys.stderr):
                if stream is not None and not stream.closed and _fileno(stream) == target.fd:
                    stream.flush()
            with open(target.fd, "wb", closefd=False) as out:
                shutil.copyfileobj(data, out)
            return
        with open(os.open(target.path, os.O_WRONLY | os.O_NOCTTY), "wb") as out:
            shutil.copyfileobj(data, out)


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def atomic_path(path: str | Path, *, durable: bool = True) -> Iterator[Path]:
    """A temporary path to write to in place of `path`. On success a regular file (or a new
    one) is fsynced (unless `durable` is False: files that live only while a job runs, such as
    a rank's status) and renamed onto the file `path` leads to (``os.replace``), keeping that
    file's owner, group and mode; a device, a FIFO or a descriptor (``/dev/stdout``) gets the
    temporary's bytes written through instead (see `write_target`). On failure the temporary is
    removed, so the file holds the old content or the new and no temporary is left. A folder at
    `path` is refused before anything is created."""
    target = write_target(path)
    if target.path.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(path))
    # a written-through target's temporary goes to the temporary folder: its own may be /dev
    folder = None if target.through else target.path.parent
    made = [] if folder is None else make_folders(folder, str(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.path.name}.", suffix=".tmp")
    except OSError as exc:
        remove_empty(made)
        raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    os.close(fd)
    try:
        yield Path(tmp)
        if target.through:
            _write_through(tmp, target)
        else:
            _replace(tmp, target.path, durable)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        remove_empty(made)
        if not isinstance(exc, OSError) or isinstance(exc, WriteError) or _stdout_closed(exc, target):
            raise
        raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a written-through target's copy
    if (done := _WRITTEN.get()) is not None:
        done.append(Path(path))


def make_folders(folder: Path, path: str) -> list[Path]:
    """Make `folder` and its missing parents; the folders made, outermost first (`remove_empty`
    takes them back). `WriteError` naming `path`, the file to be written, when one cannot be made."""
    missing = []
    for f in (folder, *folder.parents):
        if f.exists() or f.is_symlink():
            break
        missing.append(f)
    made: list[Path] = []
    for f in reversed(missing):
        try:
            f.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            remove_empty(made)
            raise WriteError(exc.errno, exc.strerror or str(exc), path) from exc
        made.append(f)
    return made


def remove_empty(made: list[Path]) -> None:
    """Remove the folders `made` (outermost first, as `make_folders` returns them) that are empty,
    innermost first: what a failed command made and did not write in."""
    for f in reversed(made):
        with contextlib.suppress(OSError):
            f.rmdir()


def install(src: Path, path: str | Path) -> None:
    """Move the finished file `src` to `path` as `atomic_path` writes one (renamed onto the file
    `path` leads to with its owner and mode, or written through a device or FIFO)."""
    with atomic_path(path) as tmp:
        shutil.move(src, tmp)


def _replace(tmp: str, path: Path, durable: bool) -> None:
    """Rename `tmp` onto `path`, fsynced first when `durable`, with the owner, group and mode of
    the file it replaces."""
    if durable:
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    _keep_owner_and_mode(tmp, old)
    os.replace(tmp, path)


def _stdout_closed(exc: BaseException, target: WriteTarget) -> bool:
    """A broken pipe on stdout (``--trace /dev/stdout | head``): the command's stdout closed early."""
    return isinstance(exc, BrokenPipeError) and target.fd is not None and target.fd == _fileno(sys.stdout)


_WRITTEN: ContextVar[list[Path] | None] = ContextVar("written", default=None)


@contextlib.contextmanager
def recorded() -> Iterator[list[Path]]:
    """The paths `atomic_path` writes while the block runs, in order: what a command wrote before
    a write of it failed."""
    done: list[Path] = []
    token = _WRITTEN.set(done)
    try:
        yield done
    finally:
        _WRITTEN.reset(token)


def atomic_write(path: str | Path, data: str | bytes, *, durable: bool = True) -> None:
    """Write `data` (text as UTF-8, or bytes) to `path` atomically (see `atomic_path`)."""
    with atomic_path(path, durable=durable) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)


def _writable_folder(folder: Path) -> bool:
    """Whether a file can be created in `folder` (a temporary is made and removed: os.access
    does not see read-only mounts or root's exemptions the way a write does)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".shardsim-write-test.", suffix=".tmp")
    except OSError as exc:
        if exc.errno in FULL:  # the path is fine: the disk is full
            raise WriteError(exc.errno, exc.strerror or str(exc), str(folder)) from exc
        return False
    os.close(fd)
    os.unlink(tmp)
    return True


def check_output_file(path: str | Path, field: str, *, inputs: Iterable[str | Path] = ()) -> Path:
    """`path` as a file shardsim can write, checked before any work is done for it: none of the
    command's `inputs` (`check_not_input`), not a folder, and its folder writable, or, when
    missing, the nearest folder above it that is there (the missing ones are made when the file
    is written: `atomic_path`); a symlink is checked as the file it leads to, and a device, a
    FIFO or ``/dev/stdout`` as written through (open for writing, nothing made). ConfigError
    naming `path` and the flag `field` otherwise."""
    p = Path(path)
    where = str(path)
    check_not_input([p], inputs, field)
    if p.is_dir():
        raise ConfigError("is a folder; expected a file path", where=where, field=field)
    target = write_target(p)
    if target.fd is not None:
        if not _open_for_writing(target.fd):
            raise ConfigError("not writable: not open for writing in this process", where=where, field=field)
        return p
    if target.through:
        if not os.access(target.path, os.W_OK):
            raise ConfigError("not writable", where=where, field=field)
        return p
    folder = _nearest_folder(target.path.parent, where, field)
    if not _writable_folder(folder) or (target.path.exists() and not os.access(target.path, os.W_OK)):
        raise ConfigError("not writable", where=where, field=field)
    return p


def _nearest_folder(folder: Path, where: str, field: str) -> Path:
    """`folder`, or the nearest folder above it that is there; ConfigError when what is there is
    not a folder (a file where a folder is to be made)."""
    for f in (folder, *folder.parents):
        if f.is_dir():
            return f
        if f.exists() or f.is_symlink():
            raise ConfigError(f"cannot make its folder {folder}: {f} is not a folder", where=where, field=field)
    return Path("/")


def _open_for_writing(fd: int) -> bool:
    try:
        return (fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)
    except OSError:
        return False


def check_output_dir(path: str | Path, field: str) -> Path:
    """`path` as a folder shardsim can write files in, checked before any work is done for it:
    a folder, or missing with the nearest folder above it writable (`output_folder` makes it;
    a symlink is kept and the folder it leads to made). ConfigError naming `path` and the flag
    `field` otherwise."""
    p = Path(path)
    where = str(path)
    if p.exists() and not p.is_dir():
        raise ConfigError("is a file; expected a folder", where=where, field=field)
    real = Path(os.path.realpath(p))
    folder = real if real.is_dir() else _nearest_folder(real.parent, where, field)
    if not _writable_folder(folder):
        raise ConfigError("cannot write in the folder", where=where, field=field)
    return p


@contextlib.contextmanager
def output_folder(path: str | Path, field: str) -> Iterator[Path]:
    """`path` checked (`check_output_dir`) and made, parents too, for the block; the folders it
    made that are still empty when the block ends (a command that failed before writing, or
    whose files could not be written) are removed again."""
    p = check_output_dir(path, field)
    made = make_folders(Path(os.path.realpath(p)), str(p))
    try:
        yield p
    finally:
        remove_empty(made)


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether `a` and `b` are the same file: one inode (symlinks followed, hard links alike)
    where both are there, the same resolved path otherwise."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def input_files(*values: object) -> list[Path]:
    """The values that name a file or folder that is there (a configuration's path-or-name
    fields: a workload, a topology, a profile): the inputs an output must not be."""
    return [Path(v) for v in values if isinstance(v, str | os.PathLike) and str(v) and os.path.lexists(v)]


def check_not_input(outputs: Iterable[str | Path], inputs: Iterable[str | Path], field: str) -> None:
    """Refuse the outputs that are one of `inputs` (`same_file`): a ConfigError naming both and
    the output's flag `field`, before any work."""
    sources = list(inputs)
    for out in outputs:
        for src in sources:
            if same_file(out, src):
                raise ConfigError(
                    f"is an input of this command ({src}); writing it would replace it: write elsewhere",
                    where=str(out),
                    field=field,
                )


class _NamedStdout:
    """A text stream whose failed writes (not a broken pipe: stdout closed early) raise
    `WriteError` naming stdout; everything else is the stream's."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise _stdout_error(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise _stdout_error(exc) from exc

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _stdout_error(exc: OSError) -> OSError:
    if isinstance(exc, BrokenPipeError | WriteError):
        return exc
    return WriteError(exc.errno, exc.strerror or str(exc), "stdout")


@contextlib.contextmanager
def named_stdout() -> Iterator[None]:
    """For the block, a write of `sys.stdout` that fails (``> /dev/full``, a full disk) raises
    `WriteError` naming stdout, as a file's failed write does."""
    stream = sys.stdout
    if stream is None:
        yield
        return
    sys.stdout = _NamedStdout(stream)
    try:
        yield
    finally:
        if isinstance(sys.stdout, _NamedStdout):
            sys.stdout = stream
