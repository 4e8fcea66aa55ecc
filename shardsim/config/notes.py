"""The warning line of a pasted key that shardsim accepts and does not model (a DeepSpeed,
SageMaker or launcher key): one line on stderr a key, naming the file, the key and why."""

from __future__ import annotations

import logging

log = logging.getLogger("shardsim")


def not_modelled(where: str, key: str, why: str) -> None:
    """Say on stderr that `key` of `where` is accepted and not modelled, and why."""
    log.warning("%s: %s accepted, not modelled: %s", where, key, why)
