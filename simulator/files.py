"""Writing files so that a reader never sees a torn one (`atomic_write`, `atomic_path`), and
checking an output path before any work is done for it (`check_output_file`, `check_output_dir`).

Every file shardsim writes gets mode `FILE_MODE` less what the process' umask removes: 0644
under the usual umask 022 (the owner writes, everyone reads), narrower where the user's umask
says so. Temporary files live next to their target and never outlive a failed write.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from shardsim.simulator.errors import ConfigError

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


@contextlib.contextmanager
def atomic_path(path: str | Path, *, durable: bool = True) -> Iterator[Path]:
    """A temporary path next to `path` to write to; on success it is fsynced (unless `durable` is
    False: files that live only while a job runs, such as a rank's status) and renamed onto `path`
    (``os.replace``), on failure removed, so `path` holds the old file or the new one and no
    temporary is left. A folder at `path` is refused before anything is created."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(path))
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        yield Path(tmp)
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise


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
    folder, its folder there (made, parents too, with `make_folder`) and writable. ConfigError
    naming `path` and the flag `field` otherwise."""
    p = Path(path)
    where = str(path)
    if p.is_dir():
        raise ConfigError("is a folder; expected a file path", where=where, field=field)
    folder = p.parent
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
    if not _writable_folder(folder) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError("not writable", where=where, field=field)
    return p


def check_output_dir(path: str | Path, field: str) -> Path:
    """`path` as a folder shardsim can write files in (made, parents too, if missing), checked
    before any work is done for it. ConfigError naming `path` and the flag `field` otherwise."""
    p = Path(path)
    where = str(path)
    if p.exists() and not p.is_dir():
        raise ConfigError("is a file; expected a folder", where=where, field=field)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot make the folder: {exc.strerror or exc}", where=where, field=field) from None
    if not _writable_folder(p):
        raise ConfigError("cannot write in the folder", where=where, field=field)
    return p
