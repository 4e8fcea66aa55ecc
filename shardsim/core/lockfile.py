"""An exclusive lock that leaves no file behind: ``flock`` on a lock file that exists only while
someone holds it.

The holder removes the file before it lets go. A process that opened the file just before that
gets the lock on a removed file; it sees that the path no longer names what it locked, and opens
the path again. So at most one process at a time holds the lock of a path, and when nobody
holds it the file is gone (a holder killed outright leaves it behind; the next holder reuses it
and removes it). The kernel drops the lock of a process that ends, however it ends.

`locked` waits for the lock; `held` refuses at once (`Busy`) with what the holder wrote in the
lock file about itself (a `WriteError` naming the lock file when that cannot be written).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from shardsim.core.errors import WriteError


def acquire(path: str | Path, *, blocking: bool = True) -> int | None:
    """Lock `path` (created when missing) and return the open descriptor that holds the lock;
    None when `blocking` is False and another process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        held = os.fstat(fd)
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # the previous holder removed the file we locked: lock the path's file again


def release(path: str | Path, fd: int) -> None:
    """Remove the lock file, then let go of the lock (see the module docstring for why in that order)."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold the lock of `path` for the block, waiting for it as long as it takes."""
    fd = acquire(path)
    assert fd is not None
    try:
        yield
    finally:
        release(path, fd)


class Busy(Exception):
    """Another process holds the lock; `holder` is what it wrote about itself ("" when nothing yet)."""

    def __init__(self, holder: str):
        self.holder = holder
        super().__init__(holder or "another process")


@contextlib.contextmanager
def held(path: str | Path, holder: str) -> Iterator[None]:
    """Hold the lock of `path` for the block, with `holder` (who this process is) in the lock
    file; `Busy`, naming the process that holds it, when another does."""
    try:
        fd = acquire(path, blocking=False)
    except OSError as exc:  # a disk with no room for even the lock file: it is named
        raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    if fd is None:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace").strip()
        except OSError:  # let go of between the two calls
            text = ""
        raise Busy(text)
    try:
        try:
            os.ftruncate(fd, 0)
            os.write(fd, holder.encode())
        except OSError as exc:
            raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        yield
    finally:
        release(path, fd)
