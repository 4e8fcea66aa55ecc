"""An exclusive lock that leaves no file behind: ``flock`` on a lock file that exists only while
someone holds it.

The holder removes the file before it lets go. A process that opened the file just before that
gets the lock on a removed file; it sees that the path no longer names what it locked, and opens
the path again. So at most one process at a time holds the lock of a path, and when nobody
holds it the file is gone (a holder killed outright leaves it, empty; the next holder reuses it
and removes it). The kernel drops the lock of a process that ends, however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


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
