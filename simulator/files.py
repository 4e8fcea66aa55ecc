"""Writing files so that a reader never sees a torn one: the one atomic-write helper."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

FILE_MODE = 0o644  # every file shardsim writes: the owner writes, everyone reads


@contextlib.contextmanager
def atomic_path(path: str | Path, *, durable: bool = True) -> Iterator[Path]:
    """A temporary path next to `path` to write to; on success it is fsynced (unless `durable` is
    False: files that live only while a job runs, such as a rank's status) and renamed onto `path`
    (``os.replace``), on failure removed, so `path` holds the old file or the new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
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
