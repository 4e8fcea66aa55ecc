"""Writing files so that a reader never sees a torn one (`atomic_write`, `atomic_path`), and
checking an output path before any work is done for it (`check_output_file`, `check_output_dir`).

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
import fcntl
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from shardsim.core.errors import ConfigError, WriteError

FILE_MODE = 0o644  # every file shardsim writes, before the umask: the owner writes, everyone reads


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
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.path.name}.", suffix=".tmp")
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
        if not isinstance(exc, OSError) or isinstance(exc, WriteError) or _stdout_closed(exc, target):
            raise
        raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a written-through target's copy
    if (done := _WRITTEN.get()) is not None:
        done.append(Path(path))


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
    except OSError:
        return False
    os.close(fd)
    os.unlink(tmp)
    return True


def check_output_file(path: str | Path, field: str, *, make_folder: bool = False) -> Path:
    """`path` as a file shardsim can write, checked before any work is done for it: not a
    folder, its folder there (made, parents too, with `make_folder`) and writable; a symlink is
    checked as the file it leads to, and a device, a FIFO or ``/dev/stdout`` as written through
    (open for writing, nothing made). ConfigError naming `path` and the flag `field` otherwise."""
    p = Path(path)
    where = str(path)
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
    folder = target.path.parent
    if make_folder:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot make its folder {folder}: {exc.strerror or exc}", where=where, field=field
            ) from None
    elif not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise ConfigError(f"its folder {folder} {what}", where=where, field=field)
    if not _writable_folder(folder) or (target.path.exists() and not os.access(target.path, os.W_OK)):
        raise ConfigError("not writable", where=where, field=field)
    return p


def _open_for_writing(fd: int) -> bool:
    try:
        return (fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)
    except OSError:
        return False


def check_output_dir(path: str | Path, field: str) -> Path:
    """`path` as a folder shardsim can write files in (made, parents too, if missing; a symlink
    is kept and the folder it leads to made), checked before any work is done for it.
    ConfigError naming `path` and the flag `field` otherwise."""
    p = Path(path)
    where = str(path)
    if p.exists() and not p.is_dir():
        raise ConfigError("is a file; expected a folder", where=where, field=field)
    try:
        Path(os.path.realpath(p)).mkdir(parents=True, exist_ok=True)  # a symlink's folder is made where it leads
    except OSError as exc:
        raise ConfigError(f"cannot make the folder: {exc.strerror or exc}", where=where, field=field) from None
    if not _writable_folder(p):
        raise ConfigError("cannot write in the folder", where=where, field=field)
    return p
