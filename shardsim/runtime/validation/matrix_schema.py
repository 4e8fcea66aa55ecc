"""The schema of a validation matrix file's own settings: how to run its rows (steps, warm-up,
timeout, the quiet-step bound, retries; bounded as `shardsim run`'s flags are) and its
description. The configuration fields it shares
with every row (workload, batch, precision, ...) and its topologies are checked as each row's
configuration is built (`matrix.load_matrix`), with the words the configuration's checks use."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BeforeValidator

from shardsim.core.documents import Document
from shardsim.runtime.train import MAX_STEPS, MAX_TIMEOUT_S

MAX_RETRIES = 100  # more attempts at one configuration


def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)


def _whole(low: int, high: int) -> BeforeValidator:
    """A whole number from `low` to `high` (2.0 reads as 2)."""

    def check(v: Any) -> int:
        if not _number(v) or not low <= v <= high or v != int(v):
            raise ValueError(f"expected a whole number from {low} to {high:,}")
        return int(v)

    return BeforeValidator(check)


def _seconds(v: Any) -> float:
    if not _number(v) or not 1 <= v <= MAX_TIMEOUT_S:
        raise ValueError(f"expected a finite number from 1 to {MAX_TIMEOUT_S:,.0f}")
    return float(v)


def _share(v: Any) -> float:
    if not _number(v) or not 0 < v <= 1:
        raise ValueError("expected a part of the cores' time, 0 < max_steal <= 1")
    return float(v)


class MatrixDoc(Document):
    """A matrix file's settings (the keys it may hold are checked by `load_matrix`)."""

    description: str | None = None
    steps: Annotated[int, _whole(1, MAX_STEPS)] = 4
    warmup: Annotated[int, _whole(0, MAX_STEPS)] = 1
    timeout: Annotated[float, BeforeValidator(_seconds)] = 60.0
    max_steal: Annotated[float, BeforeValidator(_share)] | None = None
    retries: Annotated[int, _whole(0, MAX_RETRIES)] = 2
    topologies: dict[str, Any] | None = None
