"""Warning lines on stderr: a pasted key that shardsim accepts and does not model (a DeepSpeed,
SageMaker or launcher key; a config.json's keys its family does not read), one line naming the
file, the key and why; or a setting that runs slower than it suggests (`warn`).

Said at once, or, inside `held` (a command), once each when the command is done: a command
that refuses its input prints its one line alone."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("shardsim")

_held: list[str] | None = None  # the notes of the command under way (`held`), None outside one


def not_modelled(where: str, key: str, why: str) -> None:
    """Say on stderr that `key` of `where` is accepted and not modelled, and why."""
    warn(f"{where}: {key} accepted, not modelled: {why}")


def warn(line: str) -> None:
    """Say `line` on stderr as a warning (held, and said once, inside `held`)."""
    if _held is None:
        log.warning("%s", line)
    else:
        _held.append(line)


@contextmanager
def held() -> Iterator[None]:
    """Hold the notes made inside: said once each when the block ends, dropped where it raises."""
    global _held
    outer, _held = _held, []
    try:
        yield
        lines = _held
    finally:
        _held = outer
    for line in dict.fromkeys(lines):
        log.warning("%s", line)
